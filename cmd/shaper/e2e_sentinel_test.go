package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// TestGlobalRateRedisFails: issue 13, Redis in the ways it fails — two
// shaper processes share a 50/s lane through Redis behind Sentinel (a
// primary and a replica). Under a backlog: SENTINEL FAILOVER; then kill -9
// of the master (Sentinel fails over, the killed one comes back empty as a
// replica); then FLUSHALL and SCRIPT FLUSH on the master (what a restart
// empty leaves). In every 1 s window at the downstream ≤ 51 + 1 (the
// downstream allowance of docs/scaling.md) + 1 (replicas_hint fallback, N −
// 1), no gap over 1 s, nothing lost.
func TestGlobalRateRedisFails(t *testing.T) {
	needCluster(t)
	const limit = 50.0
	primary := testserver.StartRedis(t, testserver.WithRedisArgs("--repl-diskless-sync-delay", "0"))
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica := testserver.StartRedis(t, testserver.WithRedisArgs("--replicaof", host, port, "--repl-diskless-sync-delay", "0"))
	sentinel := testserver.StartSentinel(t, "shaper", primary.Addr, 500*time.Millisecond)
	// The sentinel must know the replica before it can fail over to it.
	awaitSentinelReplica(t, sentinel, replica.Addr)

	down := newChaosDownstream(t, 0, nil)
	rig := newChaosRig(t, chaosLane{limit: limit, capacity: 100, maxInFlight: 8, ackWait: "30s", timeout: "5s",
		backoff: "[1s]", maxDeliver: 5, drainTimeout: "2s"}, down)
	var children []*child
	var admins []string
	for i := range 2 {
		admin := freeAddr(t)
		admins = append(admins, admin)
		cfg := fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
redis: { addr: %q, master_name: shaper, replicas_hint: 2 }
shutdown: { drain_timeout: 2s }
downstreams:
  %s:
    source: { stream: %s, subjects: ["chaos.jobs.>"], ack_wait: 30s, max_ack_pending: 300 }
    bucket: { capacity: 100 }
    rate: { limit: %v/s, global: true }
    task: { timeout: 5s, max_in_flight: 8 }
    sink: { kind: http, url: %q }
`, rig.nats.URL(), admin, sentinel.Addr, chaosLaneName, chaosStream, limit, down.url())
		children = append(children, startChild(t, rig.bin, "run", "-c", writeFile(t, "replica"+strconv.Itoa(i)+".yaml", cfg)))
		waitReady(t, admin, 20*time.Second)
	}
	// Each replica shows its own fallback on its /metrics: poll the gauges.
	sawFallback := make([]atomic.Bool, len(admins))
	stopPoll := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for i, a := range admins {
				if _, body, err := httpGet("http://" + a + "/metrics"); err == nil &&
					strings.Contains(body, `shaper_global_limiter_fallback{lane="`+chaosLaneName+`"} 1`) {
					sawFallback[i].Store(true)
				}
			}
		}
	}()
	const n = 1200
	rig.publish("r", n)
	began := time.Now()
	at := func(d time.Duration) { time.Sleep(time.Until(began.Add(d))) }

	at(4 * time.Second)
	failover := time.Now()
	sentinel.Failover("shaper")
	awaitMaster(t, sentinel, replica.Addr)
	t.Logf("SENTINEL FAILOVER: %s is master after %v", replica.Addr, time.Since(failover).Round(time.Millisecond))

	at(10 * time.Second)
	kill := time.Now()
	replica.Kill()
	awaitMaster(t, sentinel, primary.Addr)
	t.Logf("kill -9 of the master: %s is master again after %v", primary.Addr, time.Since(kill).Round(time.Millisecond))
	replica.Start() // empty (no persistence), a replica of the old primary again

	at(17 * time.Second)
	if got := primary.Do("FLUSHALL"); got != "+OK" {
		t.Fatalf("FLUSHALL: %q", got)
	}
	if got := primary.Do("SCRIPT", "FLUSH"); got != "+OK" {
		t.Fatalf("SCRIPT FLUSH: %q", got)
	}
	t.Logf("FLUSHALL + SCRIPT FLUSH at %v", time.Since(began).Round(time.Millisecond))

	if !down.awaitDelivered(n, 60*time.Second) {
		t.Fatalf("only %d of %d delivered", down.delivered(), n)
	}
	close(stopPoll)
	<-polled
	var fallback []string
	for i, c := range children {
		lines := strings.Count(c.stderrText(), "global rate unavailable")
		fallback = append(fallback, fmt.Sprintf("replica %d: %d fallback lines, gauge seen %v", i, lines, sawFallback[i].Load()))
		if lines == 0 || !sawFallback[i].Load() {
			t.Errorf("replica %d: fallback logged %d times, gauge at 1 seen %v: each replica's fallback must be logged and shown", i, lines, sawFallback[i].Load())
		}
	}
	ts, worst, maxGap := stopAndStamps(t, down, children) // e2e_sentinel_test.go
	span := ts[len(ts)-1].Sub(ts[0]).Seconds()
	t.Logf("%d over %.2fs: %.1f/s; worst 1 s window %d; largest gap %v; %v", len(ts), span,
		float64(len(ts)-1)/span, worst, maxGap.Round(time.Millisecond), fallback)
	assertRate(t, "1s windows across the failures", ts, time.Second, 53)
	if maxGap > time.Second {
		t.Errorf("a gap of %v at the downstream, want ≤ 1s (no stall)", maxGap)
	}
	rig.lane.limit = 52 // reconcile's window bound is limit + 1; the window was judged above
	rig.reconcile(0)
}

func awaitSentinelReplica(t *testing.T, s *testserver.Sentinel, replica string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !s.KnowsReplica("shaper", replica) {
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel did not learn replica %s", replica)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func awaitMaster(t *testing.T, s *testserver.Sentinel, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for s.Master("shaper") != want {
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel names master %q, want %s", s.Master("shaper"), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopAndStamps stops the shaper processes children and returns what down
// received: the arrivals' kernel stamps, sorted, the most of them in any
// 1 s window, and the largest gap between two (the Redis failure tests).
func stopAndStamps(t *testing.T, down *chaosDownstream, children []*child) (ts []time.Time, worst int, maxGap time.Duration) {
	t.Helper()
	for _, c := range children {
		stopShaper(t, c, 15*time.Second)
	}
	reqs := down.requests()
	ts = make([]time.Time, len(reqs))
	for i, q := range reqs {
		ts[i] = q.at
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	worst, _ = maxInWindow(ts, time.Second)
	for i := 1; i < len(ts); i++ {
		maxGap = max(maxGap, ts[i].Sub(ts[i-1]))
	}
	return ts, worst, maxGap
}
