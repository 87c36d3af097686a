package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// TestCase_C33_RedisFailoverScriptCacheClockLeases: field case C33 (CASES.md;
// vutran1710/PyrateLimiter#182: NOSCRIPT during a Redis failover) end to end.
// A failover breaks three assumptions of the shared schedule at once: the
// cached script is gone, the new master's wall clock differs (a TAT stored on
// the old clock is seconds ahead of or behind the new one), and a new master
// without persistence knows nothing of the slots the replicas hold from the
// old one.
//
// Input (the case's numbers): two shaper processes, A and B, share one lane:
// rate.limit 20/s, rate.global true, redis.replicas_hint 2, bucket.capacity
// 200, task.max_in_flight 8; one stream of 3000 messages, published once
// both report ready (t = 0 is the start of that publish); the downstream
// answers 2xx after 2 ms and tells the instances apart by the sink URL,
// which each process gets from SHAPER_DOWNSTREAMS_CHAOS_SINK_URL
// (/callback/A, /callback/B; the file names /callback/config-file, so a
// request there means the variable was not applied). One redis-server,
// under libfaketime (testserver.WithSteppableClock), is the shared store.
// Events:
//   - t=10: SCRIPT FLUSH (after CONFIG RESETSTAT).
//   - t=20: SHUTDOWN SAVE, then redis-server started again on the same port
//     and the same dump (checked: dump.rdb written, and INFO persistence
//     rdb_last_load_keys_loaded ≥ 1) with its clock 5 s behind the real time.
//   - t=35: SHUTDOWN NOSAVE, dump.rdb deleted, started again empty
//     (rdb_last_load_keys_loaded 0) with its clock 5 s ahead.
//   - A MONITOR connection runs throughout (re-opened after each restart);
//     the test attributes each script command to A or B by the client port
//     of the command and the owner of that socket in /proc.
//   - At t=50 both processes get SIGTERM (drain 2 s); then the test takes
//     what the stream still holds for the lane's consumer.
//
// Assertions (windows and counts are of requests at the downstream, at the
// kernel's receive timestamps, newStampedServer; a window is [x, x+1 s)):
//  1. Every 1 s window of the combined arrivals holds ≤ 23, and so does
//     every window starting in [35,40) (the window where leases of the old
//     Redis could double-admit). The case says 21 (floor(20) + 1); 23 is the
//     allowance every existing global-rate end-to-end test with Redis events
//     uses (TestGlobalRateRedisClockSteps, TestGlobalRateSentinelClockSteps,
//     TestGlobalRateRedisFails, TestGlobalRateRedisCluster: 53 at 50/s):
//     + 1 at the downstream for a replica's late write (docs/scaling.md
//     "At the downstream: late writes"), + 1 for the fallback's N − 1
//     or a forward clock step's 1 + slack (the case's own "≤ 1 + slack
//     extra" at t=35). The worst window is logged, so a run above 21 shows.
//  2. t=10: each instance's shaper_global_limiter_fallback (polled on its
//     /metrics every 100 ms) is 1 for ≤ 1 s in all in [10,20); 100 ± 3
//     combined in [10,15); from MONITOR, each instance sends ≤ 2 script
//     loads (EVAL or SCRIPT LOAD) in [10,11), none in [11,20), and EVALSHA
//     again in [11,20) (no EVAL per call); cross-checked with INFO
//     commandstats: ≤ 4 EVAL in all by t=11 and none more by t=19.9.
//  3. t=20: no two consecutive whole seconds [k,k+1), k = 0…49, with 0
//     combined arrivals (applied to the whole run: a TAT 5 s ahead of the
//     new clock must be moved back, not waited out); ≥ 170 combined in
//     [21,30); each instance's fallback gauge is 1 for ≤ 2 s in all in
//     [20,35), and never later than 2 s after the restarted Redis answered.
//     The server that ran [20,35) saw ≤ 4 EVAL (2 a process) in its life.
//  4. t=35: ≥ 170 combined in [36,45); the step ahead's burst is judged by
//     assertion 1; fallback as in 3 over [35,50) (the case states the ≤ 2 s
//     for t=20; the restart at t=35 is the same kind of outage); ≤ 4 EVAL
//     on the third server by t=49.9.
//  5. Totals: 930–1001 combined in [0,50); 0 dead letters (the dead-letter
//     stream and shaper_dead_letters_total of both); 0 script errors on the
//     delivery path (no "NOSCRIPT" in either process's log, no outcome
//     retry or dead_letter in shaper_deliveries_total); nothing lost: every
//     published message was answered 2xx at the downstream, is in the
//     dead-letter stream, or was still held by the stream for the lane's
//     consumer after both stopped (the test fetches and acks those), and no
//     message is in two of these (no duplicate delivery either, as the
//     other global tests' ledgers require). Every request came from A or B
//     (the per-instance sink URL), and both delivered.
//
// Adapted from the case: the lane is named "chaos", not "p", so the chaos
// rig's ledger finds its dead letters (shaper.dead.chaos), and the variable
// is SHAPER_DOWNSTREAMS_CHAOS_SINK_URL; the downstream answers 204 (the chaos
// downstream's 2xx) rather than 200; source.max_ack_pending is 416 (2 ×
// (capacity + max_in_flight), docs/scaling.md "Running N replicas": the
// consumer's is shared) and ack_wait 30 s, as in the other global tests; the
// 3000 messages are not all delivered within 50 s at 20/s, so "nothing lost"
// is the three-way ledger above instead of delivered-or-dead-lettered; a Go
// MONITOR client stands for `redis-cli MONITOR`. The 1 s bound is 23, not 21
// (assertion 1). At 20/s a lease is one slot (docs/scaling.md "Leases": one
// round trip a departure up to 500/s), so the slots a replica holds from the
// old Redis at t=35 are at most one or two; Redis 7 keeps no scripts in the
// dump, so the restart at t=20 empties the script cache too.
//
// Measured on the 2-core VM (2026-12-07, five runs, 55 s each), it found a
// bug: the restarts took 46–66 ms. When only one process's reservation met
// the restart (connection refused, which was not retried), that process
// fell back to limit / replicas_hint (10/s) for the probe interval (1 s)
// while the other kept the full 20/s from the shared schedule: 28 in
// [20,21) and 29–30 in [35,36) (e.g. A 10 + B 20), worst 1 s window 30,
// 1017–1018 in [0,50); assertion 1 and the total failed (4 runs of 5). A
// reservation refused after an answer now dials again for up to 300 ms
// (redisslots restartWait, TestReserveWaitsOutARestart): no process fell
// back, worst window 22, largest gap 179 ms (at the t=20 restart).
func TestCase_C33_RedisFailoverScriptCacheClockLeases(t *testing.T) {
	needCluster(t)
	const (
		limit       = 20.0
		capacity    = 200
		maxInFlight = 8
		n           = 3000
		bound       = 23 // floor(20) + 1, + 1 at the downstream, + 1 fallback/step (assertion 1)
	)
	insts := []string{"A", "B"}
	redis := testserver.StartRedis(t, testserver.WithSteppableClock(t))
	_, redisPortS, _ := strings.Cut(redis.Addr, ":")
	redisPort, _ := strconv.Atoi(redisPortS)

	// The downstream: the chaos downstream (2 ms, 2xx), which also notes
	// the instance each request came from (its path).
	down := &chaosDownstream{latency: 2 * time.Millisecond, ok: map[string]int{}}
	var arrMu sync.Mutex
	var arrivals []c33Arrival
	down.srv = newStampedServer(t, func(w http.ResponseWriter, r *http.Request, at time.Time) {
		arrMu.Lock()
		arrivals = append(arrivals, c33Arrival{at: at, inst: strings.TrimPrefix(r.URL.Path, "/callback/")})
		arrMu.Unlock()
		down.serveHTTP(w, r, at)
	})
	rig := newChaosRig(t, chaosLane{limit: limit, capacity: capacity, maxInFlight: maxInFlight, ackWait: "30s", timeout: "5s",
		backoff: "[1s]", maxDeliver: 5, drainTimeout: "2s"}, down)

	var children []*child
	var admins []string
	pids := map[string]int{}
	for i, name := range insts {
		admin := freeAddr(t)
		admins = append(admins, admin)
		cfg := fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
redis: { addr: %q, replicas_hint: 2 }
shutdown: { drain_timeout: 2s }
downstreams:
  %s:
    source: { stream: %s, subjects: ["chaos.jobs.>"], ack_wait: 30s, max_ack_pending: %d }
    bucket: { capacity: %d }
    rate: { limit: %v/s, global: true }
    task: { timeout: 5s, max_in_flight: %d }
    sink: { kind: http, url: %q }
`, rig.nats.URL(), admin, redis.Addr, chaosLaneName, chaosStream, 2*(capacity+maxInFlight), capacity, limit, maxInFlight,
			down.srv.URL+"/callback/config-file")
		// The case: the sink URL carries the instance's name, from the
		// environment (SPEC §4: SHAPER_<PATH>), which the child inherits.
		t.Setenv("SHAPER_DOWNSTREAMS_"+strings.ToUpper(chaosLaneName)+"_SINK_URL", down.srv.URL+"/callback/"+name)
		c := startChild(t, rig.bin, "run", "-c", writeFile(t, "instance"+strconv.Itoa(i)+".yaml", cfg))
		children = append(children, c)
		pids[name] = c.cmd.Process.Pid
		waitReady(t, admin, 20*time.Second)
	}

	mon := startC33Monitor(redis.Addr, redisPort, pids)
	defer mon.close()
	gauges := startC33GaugePoll(admins)
	defer gauges.close()

	began := time.Now()
	rig.publish("p", n)
	at := func(d time.Duration) { time.Sleep(time.Until(began.Add(d))) }
	tAt := func(x time.Time) string { return fmt.Sprintf("t=%.3f", x.Sub(began).Seconds()) }
	t.Logf("3000 published by %s", tAt(time.Now()))

	// t=10: SCRIPT FLUSH.
	at(10 * time.Second)
	c33OK(t, redis.Do("CONFIG", "RESETSTAT"), "CONFIG RESETSTAT")
	flushAt := time.Now()
	c33OK(t, redis.Do("SCRIPT", "FLUSH"), "SCRIPT FLUSH")
	t.Logf("SCRIPT FLUSH at %s", tAt(flushAt))
	at(11 * time.Second)
	eval11, _ := testserver.CommandStats(t, redis, "eval")
	sha11, noscript11 := testserver.CommandStats(t, redis, "evalsha")
	at(19*time.Second + 900*time.Millisecond)
	eval19, _ := testserver.CommandStats(t, redis, "eval")
	sha19, noscript19 := testserver.CommandStats(t, redis, "evalsha")
	t.Logf("INFO commandstats since the flush: at t=11 %d EVAL, %d EVALSHA (%d failed); at t=19.9 %d EVAL, %d EVALSHA (%d failed)",
		eval11, sha11, noscript11, eval19, sha19, noscript19)

	// t=20: SHUTDOWN SAVE, restart on the same dump with the clock 5 s behind.
	dump := filepath.Join(c33Dir(t, redis.Addr), "dump.rdb")
	at(20 * time.Second)
	down20 := time.Now()
	c33Shutdown(t, redis, "SAVE")
	if st, err := os.Stat(dump); err != nil || st.Size() == 0 {
		t.Fatalf("SHUTDOWN SAVE left no dump at %s: %v", dump, err)
	}
	redis.StepClock(-5 * time.Second)
	redis.Start()
	up20 := time.Now()
	loaded20 := c33InfoField(t, redis.Addr, "persistence", "rdb_last_load_keys_loaded")
	t.Logf("SHUTDOWN SAVE at %s; up again on the dump (%s keys loaded) with its clock 5 s behind at %s (down %v)",
		tAt(down20), loaded20, tAt(up20), up20.Sub(down20).Round(time.Millisecond))
	if k, _ := strconv.Atoi(loaded20); k < 1 {
		t.Errorf("the restart at t=20 loaded %q keys from the dump, want ≥ 1 (the lane's schedule): not the case's restart on the same dump", loaded20)
	}
	at(34*time.Second + 900*time.Millisecond)
	eval34, _ := testserver.CommandStats(t, redis, "eval")
	sha34, noscript34 := testserver.CommandStats(t, redis, "evalsha")
	t.Logf("INFO commandstats of the server of [20,35): %d EVAL, %d EVALSHA (%d failed)", eval34, sha34, noscript34)

	// t=35: SHUTDOWN NOSAVE, delete the dump, restart empty 5 s ahead.
	at(35 * time.Second)
	down35 := time.Now()
	c33Shutdown(t, redis, "NOSAVE")
	if err := os.Remove(dump); err != nil {
		t.Fatalf("delete the dump: %v", err)
	}
	redis.StepClock(5 * time.Second)
	redis.Start()
	up35 := time.Now()
	loaded35 := c33InfoField(t, redis.Addr, "persistence", "rdb_last_load_keys_loaded")
	t.Logf("SHUTDOWN NOSAVE at %s; dump deleted; up again empty (%s keys loaded) with its clock 5 s ahead at %s (down %v)",
		tAt(down35), loaded35, tAt(up35), up35.Sub(down35).Round(time.Millisecond))
	if loaded35 != "0" {
		t.Errorf("the restart at t=35 loaded %q keys, want 0 (empty)", loaded35)
	}
	at(49*time.Second + 900*time.Millisecond)
	eval49, _ := testserver.CommandStats(t, redis, "eval")
	sha49, noscript49 := testserver.CommandStats(t, redis, "evalsha")
	t.Logf("INFO commandstats of the server of [35,50): %d EVAL, %d EVALSHA (%d failed)", eval49, sha49, noscript49)
	at(50 * time.Second)

	// Before the stop: what each process says about its deliveries.
	var deadMetric, retries float64
	for i, a := range admins {
		s := scrape(t, a)
		deadMetric += laneMetricSum(s, "shaper_dead_letters_total")
		retries += laneMetric(t, s, "shaper_deliveries_total", "outcome", "retry") +
			laneMetric(t, s, "shaper_deliveries_total", "outcome", "dead_letter")
		t.Logf("%s: departures %v, delivered %v, slots dropped %v",
			insts[i], laneMetric(t, s, "shaper_departures_total"),
			laneMetric(t, s, "shaper_deliveries_total", "outcome", "success"),
			laneMetric(t, s, "shaper_global_slots_dropped_total"))
	}
	gauges.close()
	for _, c := range children {
		stopShaper(t, c, 15*time.Second)
	}
	mon.close()

	// The downstream's arrivals, combined and per instance.
	arrMu.Lock()
	arr := slices.Clone(arrivals)
	arrMu.Unlock()
	sort.Slice(arr, func(i, j int) bool { return arr[i].at.Before(arr[j].at) })
	ts := make([]time.Time, len(arr))
	perInst := map[string]int{}
	for i, a := range arr {
		ts[i] = a.at
		perInst[a.inst]++
	}
	sec := func(x float64) time.Time { return began.Add(time.Duration(x * float64(time.Second))) }
	count := func(from, to float64) int { return len(within(ts, sec(from), sec(to))) }
	var bins []int
	for k := range 50 {
		bins = append(bins, count(float64(k), float64(k+1)))
	}
	worst, worstAt := maxInWindow(ts, time.Second)
	// The worst window starting in [35,40) (at an arrival: the maximum is
	// reached there).
	var worst35 int
	var worst35At time.Time
	for _, x := range within(ts, sec(35), sec(40)) {
		if k := len(within(ts, x, x.Add(time.Second))); k > worst35 {
			worst35, worst35At = k, x
		}
	}
	t.Logf("arrivals per instance %v; per whole second from t=0: %v", perInst, bins)
	// Per instance, per whole second around each event: which instance
	// sent what (the case's downstream tells them apart).
	for _, ev := range []int{10, 20, 35} {
		var cells []string
		for k := ev - 1; k < ev+3; k++ {
			by := map[string]int{}
			for _, a := range arr {
				if !a.at.Before(sec(float64(k))) && a.at.Before(sec(float64(k+1))) {
					by[a.inst]++
				}
			}
			cells = append(cells, fmt.Sprintf("[%d,%d) A %d + B %d", k, k+1, by["A"], by["B"]))
		}
		t.Logf("around t=%d: %s", ev, strings.Join(cells, "; "))
	}
	t.Logf("worst 1 s window %d at %s (the case's 21, allowance %d); worst starting in [35,40): %d at %s; gaps: %s",
		worst, tAt(worstAt), bound, worst35, tAt(worst35At), gapSummary(ts))
	for _, e := range []struct {
		what string
		at   time.Time
	}{{"SCRIPT FLUSH", flushAt}, {"SHUTDOWN SAVE", down20}, {"SHUTDOWN NOSAVE", down35}} {
		g, gAt := largestGap(ts, e.at.Add(-time.Second), e.at.Add(3*time.Second))
		w, _ := maxInWindow(within(ts, e.at.Add(-time.Second), e.at.Add(3*time.Second)), time.Second)
		t.Logf("around %s: largest gap %v (from %s), worst window %d", e.what, g.Round(time.Millisecond), tAt(gAt), w)
	}

	// 1. The rate, including [35,40).
	assertRate(t, "C33: combined 1 s windows at the downstream", ts, time.Second, bound)
	if worst35 > bound {
		t.Errorf("C33: %d arrivals in a 1 s window starting in [35,40) (at %s), want ≤ %d (21 + the allowance): a burst after the empty restart (per instance: see the log line around t=35)",
			worst35, tAt(worst35At), bound)
	}

	// 2. t=10.
	if got := count(10, 15); got < 97 || got > 103 {
		t.Errorf("C33 t=10: %d combined arrivals in [10,15), want 100 ± 3", got)
	}
	cmds := mon.commands()
	scriptCmds := func(inst string, from, to float64, names ...string) int {
		k := 0
		for _, c := range cmds {
			if c.inst == inst && !c.at.Before(sec(from)) && c.at.Before(sec(to)) && slices.Contains(names, c.name) {
				k++
			}
		}
		return k
	}
	var unknown []string
	for _, c := range cmds {
		if c.inst == "?" {
			unknown = append(unknown, c.name+" at "+tAt(c.at))
		}
	}
	for _, inst := range insts {
		loads := scriptCmds(inst, 10, 11, "EVAL", "SCRIPT LOAD")
		later := scriptCmds(inst, 11, 20, "EVAL", "SCRIPT LOAD")
		sha := scriptCmds(inst, 11, 20, "EVALSHA")
		t.Logf("MONITOR, %s: [10,11) %d loads, %d EVALSHA; [11,20) %d loads, %d EVALSHA; [20,35) %d loads; [35,50) %d loads",
			inst, loads, scriptCmds(inst, 10, 11, "EVALSHA"), later, sha,
			scriptCmds(inst, 20, 35, "EVAL", "SCRIPT LOAD"), scriptCmds(inst, 35, 50, "EVAL", "SCRIPT LOAD"))
		if loads > 2 {
			t.Errorf("C33 t=10: instance %s loaded the script %d times in [10,11) (MONITOR: EVAL, SCRIPT LOAD), want ≤ 2", inst, loads)
		}
		if later > 0 {
			t.Errorf("C33 t=10: instance %s sent %d more script loads in [11,20): an EVAL storm, want EVALSHA only after the reload", inst, later)
		}
		if sha == 0 {
			t.Errorf("C33 t=10: instance %s sent no EVALSHA in [11,20) (MONITOR): EVALSHA did not resume", inst)
		}
	}
	if len(unknown) > 0 {
		t.Logf("MONITOR: %d script commands from a connection of neither process (or closed before it was looked up): %v",
			len(unknown), unknown[:min(10, len(unknown))])
	}
	if eval11 > 2*len(insts) || eval19 != eval11 {
		t.Errorf("C33 t=10: INFO commandstats: %d EVAL by t=11 (want ≤ %d) and %d by t=19.9 (want no more): not one reload per call in flight",
			eval11, 2*len(insts), eval19)
	}
	if eval34 > 2*len(insts) || eval49 > 2*len(insts) {
		t.Errorf("C33: the restarted servers saw %d ([20,35)) and %d ([35,50)) EVAL, want ≤ %d each (the empty script cache loaded once per call in flight)",
			eval34, eval49, 2*len(insts))
	}
	samples := gauges.samples()
	for i, inst := range insts {
		eps := c33Episodes(samples, i)
		var desc []string
		for _, e := range eps {
			desc = append(desc, fmt.Sprintf("[%s, %s] (≤ %v)", tAt(e.first), tAt(e.cleared), e.cleared.Sub(e.first).Round(10*time.Millisecond)))
		}
		t.Logf("%s: shaper_global_limiter_fallback 1 in %v (%d polls); %d \"global rate unavailable\" log lines",
			inst, desc, len(samples), strings.Count(children[i].stderrText(), "global rate unavailable"))
		for _, l := range strings.Split(children[i].stderrText(), "\n") {
			if strings.Contains(l, "global rate") || strings.Contains(l, "redis answers") {
				t.Logf("%s: %s", inst, l)
			}
		}
		if d := c33OnFor(eps, sec(10), sec(20)); d > time.Second {
			t.Errorf("C33 t=10: instance %s showed shaper_global_limiter_fallback 1 for %v in [10,20), want 0 or ≤ 1s", inst, d.Round(10*time.Millisecond))
		}
		for _, o := range []struct {
			what           string
			from, to, upAt time.Time
		}{{"t=20", sec(20), sec(35), up20}, {"t=35", sec(35), sec(50), up35}} {
			if d := c33OnFor(eps, o.from, o.to); d > 2*time.Second {
				t.Errorf("C33 %s: instance %s showed shaper_global_limiter_fallback 1 for %v, want ≤ 2s (only while Redis is down)",
					o.what, inst, d.Round(10*time.Millisecond))
			}
			for _, e := range eps {
				if e.cleared.After(o.from) && e.first.Before(o.to) && e.cleared.After(o.upAt.Add(2*time.Second)) {
					t.Errorf("C33 %s: instance %s showed shaper_global_limiter_fallback 1 until %s, more than 2 s after Redis answered again (%s)",
						o.what, inst, tAt(e.cleared), tAt(o.upAt))
				}
			}
		}
		if d := c33OnFor(eps, began, sec(10)); d > 0 {
			t.Logf("%s: fallback for %v in [0,10), before any event", inst, d)
		}
	}

	// 3. t=20: no two consecutive empty seconds; ≥ 170 in [21,30).
	for k := 1; k < len(bins); k++ {
		if bins[k-1] == 0 && bins[k] == 0 {
			t.Errorf("C33 t=20: no arrival at the downstream in [%d,%d) nor in [%d,%d): a stall", k-1, k, k, k+1)
		}
	}
	if got := count(21, 30); got < 170 {
		t.Errorf("C33 t=20: %d combined arrivals in [21,30), want ≥ 170", got)
	}
	// 4. t=35.
	if got := count(36, 45); got < 170 {
		t.Errorf("C33 t=35: %d combined arrivals in [36,45), want ≥ 170", got)
	}

	// 5. Totals, errors, ledger.
	total := count(0, 50)
	t.Logf("combined in [0,50): %d; [10,15) %d, [21,30) %d, [36,45) %d", total, count(10, 15), count(21, 30), count(36, 45))
	if total < 930 || total > 1001 {
		t.Errorf("C33: %d combined arrivals in [0,50), want 930–1001", total)
	}
	for i, c := range children {
		if strings.Contains(strings.ToUpper(c.stderrText()), "NOSCRIPT") {
			t.Errorf("C33: instance %s logged a NOSCRIPT error: a script error reached the delivery path", insts[i])
		}
	}
	if retries > 0 || deadMetric > 0 {
		t.Errorf("C33: shaper_deliveries_total retry + dead_letter %v, shaper_dead_letters_total %v, want 0", retries, deadMetric)
	}
	for inst, k := range perInst {
		if inst != "A" && inst != "B" {
			t.Errorf("C33: %d requests at %q, want /callback/A or /callback/B (SHAPER_DOWNSTREAMS_%s_SINK_URL)", k, inst, strings.ToUpper(chaosLaneName))
		}
	}
	for _, inst := range insts {
		if perInst[inst] == 0 {
			t.Errorf("C33: instance %s delivered nothing", inst)
		}
	}
	rest := c33TakeRest(t, rig)
	dead := rig.deadLetters()
	okKeys := map[string]int{}
	published := map[string]bool{}
	for _, k := range rig.keys {
		published[k] = true
	}
	for _, q := range down.requests() {
		if q.status/100 == 2 {
			okKeys[q.key]++
		}
		if !published[q.key] || q.bodyID != q.key {
			t.Errorf("C33: a request with Idempotency-Key %q for message %q, not a published message's own key", q.key, q.bodyID)
		}
	}
	var lost, twice, dups []string
	for _, k := range rig.keys {
		in := 0
		if okKeys[k] > 0 {
			in++
		}
		if dead[k] != nil {
			in++
		}
		if rest[k] > 0 {
			in++
		}
		switch {
		case in == 0:
			lost = append(lost, k)
		case in > 1:
			twice = append(twice, k)
		}
		if okKeys[k] > 1 || rest[k] > 1 {
			dups = append(dups, k)
		}
	}
	t.Logf("ledger: published %d; delivered %d, dead-lettered %d, still in the stream %d; lost %d, in two places %d, duplicates %d",
		len(rig.keys), len(okKeys), len(dead), len(rest), len(lost), len(twice), len(dups))
	if len(dead) > 0 {
		t.Errorf("C33: %d dead letters, want 0", len(dead))
	}
	if len(lost) > 0 {
		t.Errorf("C33: %d messages LOST (not delivered, not dead-lettered, not in the stream), e.g. %v", len(lost), lost[:min(20, len(lost))])
	}
	if len(twice) > 0 {
		t.Errorf("C33: %d messages both delivered (or dead-lettered) and still in the stream, e.g. %v", len(twice), twice[:min(20, len(twice))])
	}
	if len(dups) > 0 {
		t.Errorf("C33: %d messages delivered more than once, e.g. %v", len(dups), dups[:min(20, len(dups))])
	}
	t.Logf("C33 took %v", time.Since(began).Round(100*time.Millisecond))
}

// c33Arrival is one request at the downstream: its kernel receive time and
// the instance named by its path.
type c33Arrival struct {
	at   time.Time
	inst string
}

// c33OK fails the test unless reply is +OK.
func c33OK(t *testing.T, reply, what string) {
	t.Helper()
	if reply != "+OK" {
		t.Fatalf("%s: %q", what, reply)
	}
}

// c33Client connects to the Redis at addr with go-redis, for the test's own
// commands (no retries: a failure is the test's), closed by t.Cleanup.
func c33Client(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	rc := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: 10 * time.Second, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

// c33Dir returns the server's working directory (CONFIG GET dir): where its
// dump is.
func c33Dir(t *testing.T, addr string) string {
	t.Helper()
	m, err := c33Client(t, addr).ConfigGet(context.Background(), "dir").Result()
	if err != nil || m["dir"] == "" {
		t.Fatalf("CONFIG GET dir: %v %v", m, err)
	}
	return m["dir"]
}

// c33InfoField returns field of INFO section ("" when absent).
func c33InfoField(t *testing.T, addr, section, field string) string {
	t.Helper()
	s, err := c33Client(t, addr).Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			return v
		}
	}
	return ""
}

// c33Shutdown sends SHUTDOWN mode (SAVE or NOSAVE), which go-redis reports
// as done when the server closed the connection (it exits once the dump, if
// any, is written); then it reaps the process (Kill of a process that has
// exited), so that Start can run it again on the same port and directory.
// testserver's Do cannot send it: SHUTDOWN has no reply when it works.
func c33Shutdown(t *testing.T, r *testserver.Redis, mode string) {
	t.Helper()
	rc := c33Client(t, r.Addr)
	ctx := context.Background()
	var err error
	if mode == "SAVE" {
		err = rc.ShutdownSave(ctx).Err()
	} else {
		err = rc.ShutdownNoSave(ctx).Err()
	}
	if err != nil {
		t.Fatalf("SHUTDOWN %s: %v", mode, err)
	}
	r.Kill()
}

// c33Cmd is one script command MONITOR showed, with the local time it
// arrived and the instance whose connection sent it ("?" unknown).
type c33Cmd struct {
	at   time.Time
	inst string
	name string // EVAL, EVALSHA, SCRIPT LOAD
}

// c33Monitor runs MONITOR on a Redis that restarts (it connects again) and
// keeps the script commands, attributed to the processes of pids by the
// owner of the client socket (/proc/net/tcp and /proc/<pid>/fd).
type c33Monitor struct {
	addr      string
	redisPort int
	pids      map[string]int

	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu     sync.Mutex
	conn   net.Conn
	cmds   []c33Cmd
	owners map[int]string // client port -> instance
}

func startC33Monitor(addr string, redisPort int, pids map[string]int) *c33Monitor {
	m := &c33Monitor{addr: addr, redisPort: redisPort, pids: pids, stop: make(chan struct{}), done: make(chan struct{}),
		owners: map[int]string{}}
	go m.run()
	return m
}

func (m *c33Monitor) run() {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		c, err := net.DialTimeout("tcp", m.addr, 200*time.Millisecond)
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		m.mu.Lock()
		select {
		case <-m.stop:
			m.mu.Unlock()
			_ = c.Close()
			return
		default:
		}
		m.conn = c
		m.mu.Unlock()
		if _, err := c.Write([]byte("MONITOR\r\n")); err == nil { // an inline command; its replies are lines
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					break
				}
				m.line(time.Now(), line)
			}
		}
		_ = c.Close()
	}
}

// line takes one MONITOR line: +<time> [<db> <addr>] "CMD" "arg" ...
func (m *c33Monitor) line(now time.Time, line string) {
	i := strings.IndexByte(line, '[')
	j := strings.IndexByte(line, ']')
	if !strings.HasPrefix(line, "+") || i < 0 || j < i {
		return
	}
	_, addr, _ := strings.Cut(line[i+1:j], " ")
	args := strings.Split(strings.TrimSpace(line[j+1:]), " ")
	name := strings.ToUpper(strings.Trim(args[0], `"`))
	switch name {
	case "EVAL", "EVALSHA":
	case "SCRIPT":
		if len(args) < 2 || strings.ToUpper(strings.Trim(args[1], `"`)) != "LOAD" {
			return // SCRIPT FLUSH (the test's own), EXISTS, …
		}
		name = "SCRIPT LOAD"
	default:
		return
	}
	_, portS, ok := strings.Cut(addr, ":")
	if !ok {
		return // "lua": a command inside a script
	}
	port, _ := strconv.Atoi(portS)
	m.mu.Lock()
	defer m.mu.Unlock()
	inst, known := m.owners[port]
	if !known {
		inst = c33SocketOwner(m.pids, port, m.redisPort)
		if inst != "?" {
			m.owners[port] = inst
		}
	}
	m.cmds = append(m.cmds, c33Cmd{at: now, inst: inst, name: name})
}

func (m *c33Monitor) commands() []c33Cmd {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.cmds)
}

func (m *c33Monitor) close() {
	m.once.Do(func() {
		m.mu.Lock()
		close(m.stop)
		if m.conn != nil {
			_ = m.conn.Close()
		}
		m.mu.Unlock()
		<-m.done
	})
}

// c33SocketOwner returns the name in pids of the process that holds the
// TCP socket from localPort to remotePort on loopback, or "?".
func c33SocketOwner(pids map[string]int, localPort, remotePort int) string {
	inode := ""
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) < 10 {
				continue
			}
			if c33HexPort(fs[1]) == localPort && c33HexPort(fs[2]) == remotePort {
				inode = fs[9]
			}
		}
	}
	if inode == "" {
		return "?"
	}
	want := "socket:[" + inode + "]"
	for name, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == want {
				return name
			}
		}
	}
	return "?"
}

// c33HexPort is the port of a /proc/net/tcp address (hex addr:hex port).
func c33HexPort(a string) int {
	_, p, ok := strings.Cut(a, ":")
	if !ok {
		return -1
	}
	v, err := strconv.ParseInt(p, 16, 32)
	if err != nil {
		return -1
	}
	return int(v)
}

// c33Gauge is one poll of an instance's shaper_global_limiter_fallback.
type c33Gauge struct {
	at   time.Time
	inst int
	v    float64
}

// c33GaugePoll polls every admin's /metrics every 100 ms.
type c33GaugePoll struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
	mu   sync.Mutex
	got  []c33Gauge
}

func startC33GaugePoll(admins []string) *c33GaugePoll {
	p := &c33GaugePoll{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			for i, a := range admins {
				code, body, err := httpGet("http://" + a + "/metrics")
				if err != nil || code != http.StatusOK {
					continue
				}
				at := time.Now()
				ss, err := parseMetrics(body)
				if err != nil {
					continue
				}
				for _, s := range ss {
					if s.name == "shaper_global_limiter_fallback" && s.labels["lane"] == chaosLaneName {
						p.mu.Lock()
						p.got = append(p.got, c33Gauge{at: at, inst: i, v: s.value})
						p.mu.Unlock()
					}
				}
			}
		}
	}()
	return p
}

func (p *c33GaugePoll) samples() []c33Gauge {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

func (p *c33GaugePoll) close() {
	p.once.Do(func() {
		close(p.stop)
		<-p.done
	})
}

// c33Episode is a run of polls showing the gauge at 1: from the first such
// poll to the next poll showing 0 (an upper bound of how long it was 1).
type c33Episode struct{ first, cleared time.Time }

func c33Episodes(samples []c33Gauge, inst int) []c33Episode {
	var out []c33Episode
	var cur *c33Episode
	var last time.Time
	for _, s := range samples {
		if s.inst != inst {
			continue
		}
		last = s.at
		switch {
		case s.v >= 1 && cur == nil:
			cur = &c33Episode{first: s.at}
		case s.v < 1 && cur != nil:
			cur.cleared = s.at
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil { // still 1 at the last poll
		cur.cleared = last.Add(100 * time.Millisecond)
		out = append(out, *cur)
	}
	return out
}

// c33OnFor is how long the episodes overlap [from, to).
func c33OnFor(eps []c33Episode, from, to time.Time) time.Duration {
	var d time.Duration
	for _, e := range eps {
		a, b := e.first, e.cleared
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			d += b.Sub(a)
		}
	}
	return d
}

// c33TakeRest fetches and acks what the stream still holds for the lane's
// consumer once every shaper stopped (never delivered, or handed back by a
// drain), until it holds nothing, and returns those keys (Nats-Msg-Id) with
// how often each came.
func c33TakeRest(t *testing.T, r *chaosRig) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cons, err := r.js.Consumer(ctx, chaosStream, chaosConsumer)
	if err != nil {
		t.Fatalf("the lane's consumer: %v", err)
	}
	rest := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return rest
		}
		if time.Now().After(deadline) {
			t.Errorf("the lane's consumer still holds messages 60s after the stop: %+v, %v", info, err)
			return rest
		}
		batch, err := cons.Fetch(400, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for m := range batch.Messages() {
			rest[m.Headers().Get(jetstream.MsgIDHeader)]++
			if err := m.DoubleAck(ctx); err != nil {
				t.Errorf("ack of a remaining message: %v", err)
			}
		}
	}
}
