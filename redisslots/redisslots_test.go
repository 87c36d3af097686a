package redisslots

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
)

// The schedule script against a real redis-server (startRedis).

func interval(perSecond float64) time.Duration {
	return time.Duration(float64(time.Second) / perSecond)
}

// consume runs one replica's departure loop on ls until stop, as the lane
// does (drain.Lane.globalAt): it reserves a slot, waits until it with w,
// drops it when the wait woke too late for it (telling the schedule, which
// makes it up), and records the slot (as the server's instant: serverTime) and the
// departure; dropped counts the slots it dropped. offer (if > 0) spaces the attempts like a producer offering
// that many per second: an attempt never starts before the previous one's
// offer time. worstU is the largest uncertainty of the clock anchor that
// placed a used slot on the local clock (clockSync: half the anchor's round
// trip, and the drift since): how far a departure may be from the server's
// instant of its slot, beyond its own lateness.
func consume(ls *LaneSlots, req drain.SlotRequest, stop time.Time, offer time.Duration, w drain.Waiter,
	clockOffset time.Duration) (slots, departures []time.Time, dropped int, worstU time.Duration, err error) {
	ctx := context.Background()
	iv := req.Interval
	if w == nil {
		w = drain.TimerWaiter{}
	}
	w.Bind()
	defer w.Unbind()
	next := time.Now()
	for time.Now().Before(stop) {
		if offer > 0 {
			if _, err := w.Wait(ctx, next, nil); err != nil {
				return slots, departures, dropped, worstU, err
			}
			next = next.Add(offer)
		}
		s, err := ls.Reserve(ctx, req)
		if err != nil {
			return slots, departures, dropped, worstU, err
		}
		s = s.Add(-clockOffset)
		if _, err := w.Wait(ctx, s, nil); err != nil {
			return slots, departures, dropped, worstU, err
		}
		now := time.Now()
		if now.Sub(s) > shaper.SlotTolerance(iv, req.Slack, req.MinSpacing) {
			// Woke too late for this slot: not used; the schedule makes
			// it up (as the lane does: drain.SlotReleaser).
			if err := ls.Release(ctx, s.Add(clockOffset), req); err != nil {
				return slots, departures, dropped, worstU, err
			}
			dropped++
			continue
		}
		departures = append(departures, now)
		ls.mu.Lock()
		worstU = max(worstU, ls.sync.uncertainty(now))
		ls.mu.Unlock()
		slots = append(slots, serverTime(ls, s.Add(clockOffset)))
	}
	return slots, departures, dropped, worstU, nil
}

// serverTime is the slot at (local time) as the server's instant, converted
// back with the replica's clock sync at once (the sync that converted it):
// the slots of all replicas are then compared on the one clock of the
// schedule, without the replicas' conversion errors (up to half a round
// trip each, some 100 µs under -race on a loaded machine).
func serverTime(ls *LaneSlots, at time.Time) time.Time {
	return time.Unix(0, int64(serverMicros(ls, at)*1000))
}

// serverMicros is serverTime in the server's microseconds (to its 0.25 µs
// step, without a round to nanoseconds).
func serverMicros(ls *LaneSlots, at time.Time) float64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.sync.serverMicros(at)
}

// TestRedisGCRATwoReplicas: two clients (two replicas) on one lane at
// 150/s for 3 s: the shared schedule gives at most 151 slots in any 1 s
// window (floor(W × limit) + 1, SPEC G1 across replicas), the departures
// too, and the aggregate is at least 148/s (a slot dropped after a late
// wake-up is made up: 149.9–150.3/s quiet, 148.9–150.3/s beside a CPU hog;
// before the make-up one CI run gave 146/s) and at most 0.5 % above the
// limit (the make-up of one drop over the 3 s span adds up to 0.2 %).
func TestRedisGCRATwoReplicas(t *testing.T) {
	rd := startRedis(t)
	iv := interval(150)
	stop := time.Now().Add(3 * time.Second)
	var (
		mu           sync.Mutex
		slots, deps  []time.Time
		wg           sync.WaitGroup
		firstErr     error
		perClient    [2]int
		dropped      int
		rs0          = newSlots(t, rd.Addr)
		rs1          = newSlots(t, rd.Addr)
		clientsSlots = []*LaneSlots{rs0.Lane("payments"), rs1.Lane("payments")}
	)
	for i, ls := range clientsSlots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, d, n, _, err := consume(ls, slotReq(iv), stop, 0, drain.NewPreciseWaiter(), 0)
			mu.Lock()
			defer mu.Unlock()
			slots, deps = append(slots, s...), append(deps, d...)
			dropped += n
			perClient[i] = len(d)
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
	span := slots[len(slots)-1].Sub(slots[0])
	rate := float64(len(slots)-1) / span.Seconds()
	t.Logf("%d departures (%v per replica) in %v: %.2f/s; max in 1 s: slots %d, departures %d",
		len(slots), perClient, span.Round(time.Millisecond), rate, maxInClosed(slots, time.Second), maxInClosed(deps, time.Second))
	if w := maxInClosed(slots, time.Second); w > 151 {
		t.Errorf("%d slots in a closed 1 s window, bound 151", w)
	}
	if w := maxInClosed(deps, time.Second); w > 151 {
		t.Errorf("%d departures in a closed 1 s window, bound 151", w)
	}
	// What the slots lack of the limit is accounted for by the slots the
	// replicas dropped (of which the schedule makes up part) plus G1's
	// 0.5 %; a slot lost any other way fails it. Where few were dropped
	// (≤ 2 %) the aggregate must also be ≥ 148/s. How many are dropped is
	// the machine's: on one VM, idle, 5 % of the waits for a slot woke
	// more than its 333 µs tolerance late, and the aggregate was 132–144/s.
	allowed := 150*span.Seconds() + 1
	short := allowed - float64(len(slots))
	t.Logf("%.0f slots short of the limit; accounted for: %d dropped, 0.5 %% (%.1f)", short, dropped, 0.005*allowed)
	if short > float64(dropped)+0.005*allowed {
		t.Errorf("%.0f slots fewer than the limit allows; the replicas dropped %d", short, dropped)
	}
	if rate < 148 && float64(dropped) <= 0.02*float64(len(slots)) { // a claim about the product: asserted without -race (race_on_test.go)
		if raceEnabled {
			t.Logf("aggregate %.2f/s, under 148/s: logged under -race, asserted without it", rate)
		} else {
			t.Errorf("aggregate %.2f/s with %d slots dropped, want ≥ 148/s", rate, dropped)
		}
	}
	if rate > 150*1.005 {
		t.Errorf("aggregate %.2f/s, want ≤ 150.75/s (SPEC G1: within 0.5 %%, neither above nor below)", rate)
	}
	if perClient[0] < 150 || perClient[1] < 150 {
		t.Errorf("per replica %v: one replica starved", perClient)
	}
}

// TestRedisLeasesAt10k: at 10,000/s a call reserves a lease of 20 slots
// (2 ms), so two replicas make about 500 round trips a second instead of
// 10,000; tat advances by exactly k × interval per lease, so the leases of
// both replicas tile one schedule; and the departures keep SPEC G1 for
// windows of 1 ms and more.
func TestRedisLeasesAt10k(t *testing.T) {
	rd := startRedis(t)
	const rate = 10000
	iv := interval(rate)
	if k := leaseSize(iv); k != 20 {
		t.Fatalf("lease size at 10,000/s = %d, want 20", k)
	}
	rs := []*RedisSlots{newSlots(t, rd.Addr), newSlots(t, rd.Addr)}
	lanes := []*LaneSlots{rs[0].Lane("fast"), rs[1].Lane("fast")}
	stop := time.Now().Add(time.Second)
	var (
		mu     sync.Mutex
		deps   []time.Time
		slots  []time.Time // in the server's clock
		wg     sync.WaitGroup
		errs   []error
		worstU time.Duration // the two replicas' worst anchor uncertainties, summed
	)
	for _, ls := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, d, _, u, err := consume(ls, slotReq(iv), stop, 0, drain.NewPreciseWaiter(), 0)
			mu.Lock()
			deps = append(deps, d...)
			slots = append(slots, s...)
			worstU += u
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
	calls := lanes[0].calls.Load() + lanes[1].calls.Load()
	span := deps[len(deps)-1].Sub(deps[0]).Seconds()
	t.Logf("%d departures in %.3f s (%.0f/s), %d round trips (%.3f per departure); max in 1 ms: %d, in 10 ms: %d, in 100 ms: %d",
		len(deps), span, float64(len(deps))/span, calls, float64(calls)/float64(len(deps)),
		maxInClosed(deps, time.Millisecond), maxInClosed(deps, 10*time.Millisecond), maxInClosed(deps, 100*time.Millisecond))
	// Leases of 20: every call grants 20 slots, used or dropped (a
	// consumer that woke too late for them). Per departure that is 1/20
	// plus what the drops add, which the starved consumers of a -race
	// build on shared cores make large (0.123 per departure in one CI run:
	// 59 % of the slots dropped in a second the machine was busy); so per
	// slot granted always, and per departure without -race
	// (scripts/test.sh) where the consumers dropped at most a quarter as
	// many slots as they used. How many they drop is the machine's: on one
	// VM, idle and without -race, 27–38 % of the slots were dropped (its
	// timer wake-ups: p90 85 µs late for a 1 ms wait, against the 55 µs a
	// slot tolerates at 10,000/s), and the dropped slots are logged.
	dropped := int64(0)
	for _, ls := range lanes {
		n, _ := ls.Dropped()
		dropped += n
	}
	t.Logf("%d slots dropped: %.1f slots used or dropped per round trip", dropped, float64(int64(len(deps))+dropped)/float64(calls))
	if per := float64(calls) / float64(int64(len(deps))+dropped); per > 1.0/15 {
		t.Errorf("%.3f round trips per slot used or dropped (%d used, %d dropped), want ≤ 1/15 (leases of 20)", per, len(deps), dropped)
	}
	if per := float64(calls) / float64(len(deps)); per > 1.0/15 {
		switch {
		case raceEnabled:
			t.Logf("%.3f round trips per departure under -race (%d slots dropped): asserted without it (scripts/test.sh)", per, dropped)
		case 4*dropped > int64(len(deps)):
			t.Logf("%.3f round trips per departure with %d slots dropped for %d used: asserted where at most a quarter are dropped", per, dropped, len(deps))
		default:
			t.Errorf("%.3f round trips per departure, want ≤ 1/15 (leases of 20; %d slots dropped)", per, dropped)
		}
	}
	// G1 above 1,000/s, windows ≥ 1 ms: floor(W × limit) + 1. The slots,
	// in the server's clock, are one schedule and keep it exactly. The
	// departures carry the cross-replica allowance of docs/scaling.md:
	// each replica places the server's clock on its own within its
	// anchor's uncertainty (half its best round trip and the drift since:
	// tens of µs, up to ~100 µs on this busy machine, about an interval
	// at 10,000/s), so the replicas' departures may meet by one more per
	// interval of the two uncertainties summed, at least one: measured,
	// not assumed (a CI run saw 103 in a 10 ms window against the fixed
	// +1's 102, its uncertainties not recorded).
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	allow := max(1, int(math.Ceil(float64(worstU)/float64(iv))))
	t.Logf("anchor uncertainties summed %v (%.2f intervals): allowance +%d", worstU, float64(worstU)/float64(iv), allow)
	for _, w := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond} {
		bound := int(w.Seconds()*rate) + 1
		if got := maxIn(slots, w); got > bound {
			t.Errorf("%d slots in a %v window of the server's clock, bound %d", got, w, bound)
		}
		if got := maxIn(deps, w); got > bound+allow {
			t.Errorf("%d departures in a %v window, bound %d + %d", got, w, bound, allow)
		}
	}
	// Under -race on two shared cores the consumers lose slots (late
	// wake-ups drop them), so only a floor here, and only without -race
	// (scripts/test.sh) and where at most a quarter as many slots were
	// dropped as used; the benchmark and docs/scaling.md give the numbers.
	// (No slot-by-slot account here: when the run stops, each consumer
	// holds up to two leases, 40 slots, that lie inside the span and were
	// neither used nor dropped; one CI run under -race was 1,162 short
	// for 1,026 dropped.)
	if r := float64(len(deps)) / span; r < 0.5*rate && 4*dropped <= int64(len(deps)) {
		if raceEnabled {
			t.Logf("aggregate %.0f/s under -race (%d slots dropped): asserted without it (scripts/test.sh)", r, dropped)
		} else {
			t.Errorf("aggregate %.0f/s, want ≥ 50%% of %d/s (%d slots dropped)", r, rate, dropped)
		}
	}

	// tat advances by exactly k × interval per lease: a third client's
	// leases follow one another without a gap or an overlap. A shared
	// pause puts them half a second ahead, so that none of their slots is
	// stale when handed out, however slowly this goroutine runs.
	ctx := context.Background()
	probe := newSlots(t, rd.Addr).Lane("fast")
	if err := probe.Pause(ctx, time.Now().Add(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	before := probe.calls.Load()
	// Each slot is read back in the server's clock, with the anchor that
	// converted it: the anchor changes only as a lease is read
	// (finishReserve, under the lane's lock), so right after Reserve it is
	// the one that made the slot. In local time a lease boundary may move
	// by the old anchor's uncertainty when a tighter round trip replaces it
	// (184 µs in one CI run under -race), which says nothing of tat.
	var got []float64
	for range 3 * 20 {
		s, err := probe.Reserve(ctx, slotReq(iv))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, serverMicros(probe, s))
	}
	ivUS := float64(iv) / float64(time.Microsecond)
	for i := 1; i < len(got); i++ {
		// Exactly one interval on the server's schedule, up to the
		// script's µs rounding and the nanoseconds of the conversion.
		if d := got[i] - got[i-1]; math.Abs(d-ivUS) > 0.01 {
			t.Errorf("slot %d is %.3f µs after the previous on the server's clock, want %.0f", i, d, ivUS)
		}
	}
	if n := probe.calls.Load() - before; n < syncSamples+3 || n > syncSamples+4 {
		t.Errorf("%d round trips for 60 slots at 10,000/s, want %d clock samples + 3 leases (+1 ahead)", n, syncSamples)
	}
}

// TestRedisScriptReloadAfterFlush: the script runs with EVALSHA; after
// SCRIPT FLUSH (or a restart, or a failover to a replica without it) the
// NOSCRIPT reply makes the client load it again, transparently.
func TestRedisScriptReloadAfterFlush(t *testing.T) {
	rd := startRedis(t)
	rs := newSlots(t, rd.Addr)
	ls := rs.Lane("payments")
	ctx := context.Background()
	if _, err := ls.Reserve(ctx, slotReq(interval(100))); err != nil {
		t.Fatal(err)
	}
	sha := rs.script.Hash()
	if got := rd.Do("SCRIPT", "EXISTS", sha); got != "*1" {
		t.Fatalf("SCRIPT EXISTS: %q", got)
	}
	if got := rd.Do("SCRIPT", "FLUSH"); got != "+OK" {
		t.Fatalf("SCRIPT FLUSH: %q", got)
	}
	if got := rd.Do("CONFIG", "RESETSTAT"); got != "+OK" {
		t.Fatalf("CONFIG RESETSTAT: %q", got)
	}
	s1, err := ls.Reserve(ctx, slotReq(interval(100)))
	if err != nil {
		t.Fatalf("Reserve after SCRIPT FLUSH: %v", err)
	}
	s2, err := ls.Reserve(ctx, slotReq(interval(100)))
	if err != nil {
		t.Fatal(err)
	}
	if d := s2.Sub(s1); d < 9900*time.Microsecond || d > 10100*time.Microsecond {
		t.Errorf("slots %v apart after the reload, want 10ms", d)
	}
	for range 20 {
		if _, err := ls.Reserve(ctx, slotReq(interval(100))); err != nil {
			t.Fatal(err)
		}
	}
	// Reloaded once, not a storm: one EVAL (which caches the script
	// again) after one NOSCRIPT, then EVALSHA only.
	info, err := rs.client.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	evals, noscript := 0, 0
	for _, line := range strings.Split(info, "\r\n") {
		if strings.HasPrefix(line, "cmdstat_eval:") {
			fmt.Sscanf(strings.TrimPrefix(line, "cmdstat_eval:"), "calls=%d", &evals)
		}
		if strings.HasPrefix(line, "cmdstat_evalsha:") {
			if i := strings.Index(line, "failed_calls="); i >= 0 {
				fmt.Sscanf(line[i:], "failed_calls=%d", &noscript)
			}
		}
	}
	if evals != 1 || noscript != 1 {
		t.Errorf("after SCRIPT FLUSH: %d EVAL and %d failed EVALSHA over 22 reservations, want 1 and 1 (reload once)", evals, noscript)
	}
	// EVAL after NOSCRIPT cached the script again: EVALSHA works.
	conn, err := net.Dial("tcp", rd.Addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if got := rd.Do("EVALSHA", sha, "2", "{test:x}:schedule", "{test:x}:quota", "reserve", "10000", "1", "0", "0"); got != "*7" { // start, now, pause, granted, remaining, spacing, comp
		t.Errorf("EVALSHA after the reload: %q", got)
	}
}

// TestRedisSkewedClock: a replica whose clock is 2 s ahead (or behind)
// gets the same slots as the others: the schedule runs on the server's
// clock, and each replica converts with the offset it measures.
func TestRedisSkewedClock(t *testing.T) {
	for _, skew := range []time.Duration{2 * time.Second, -2 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			rd := startRedis(t)
			iv := interval(150)
			a := newSlots(t, rd.Addr).Lane("payments")
			b := newSlots(t, rd.Addr, WithRedisClock(func() time.Time { return time.Now().Add(skew) })).Lane("payments")
			ctx := context.Background()
			var all []time.Time
			for range 30 {
				sa, err := a.Reserve(ctx, slotReq(iv))
				if err != nil {
					t.Fatal(err)
				}
				sb, err := b.Reserve(ctx, slotReq(iv))
				if err != nil {
					t.Fatal(err)
				}
				// b's slot is in b's clock: back to the real one.
				all = append(all, sa, sb.Add(-skew))
			}
			for i := 1; i < len(all); i++ {
				// Alternating calls take consecutive slots: 1/150 s
				// apart, up to the precision of the offset (a round
				// trip's asymmetry).
				if d := all[i].Sub(all[i-1]); d < iv-300*time.Microsecond || d > iv+300*time.Microsecond {
					t.Fatalf("slot %d is %v after the previous, want %v ± 0.3 ms", i, d, iv)
				}
			}
		})
	}
}

// TestRedisFailureIsAnError: with Redis killed, unreachable or not
// answering, Reserve returns an error within about the timeout and its
// retry's retryTimeouts × the timeout (350 ms in all at 50 ms) — never a
// slot ("allowed", case C26) and never a wait without end.
func TestRedisFailureIsAnError(t *testing.T) {
	rd := startRedis(t)
	ls := newSlots(t, rd.Addr).Lane("payments")
	ctx := context.Background()
	if _, err := ls.Reserve(ctx, slotReq(interval(100))); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, ls *LaneSlots) {
		t.Helper()
		for i := range 5 {
			start := time.Now()
			s, err := ls.Reserve(ctx, slotReq(interval(100)))
			took := time.Since(start)
			if err == nil {
				t.Fatalf("call %d: a slot %v with Redis failing, want an error", i, s)
			}
			if took > (1+retryTimeouts)*50*time.Millisecond+50*time.Millisecond {
				t.Errorf("call %d: error after %v, want about the 50ms timeout and its 300ms retry", i, took)
			}
			if i == 0 {
				t.Logf("error after %v: %v", took, err)
			}
		}
	}
	t.Run("killed", func(t *testing.T) {
		rd.Kill()
		check(t, ls)
	})
	t.Run("nothing listening", func(t *testing.T) {
		check(t, newSlots0(t, rd.Addr).Lane("payments"))
	})
	t.Run("not answering", func(t *testing.T) {
		// A listener that accepts connections and never replies: a Redis
		// stuck, or a network that swallows packets.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var conns []net.Conn
		var mu sync.Mutex
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
		defer func() {
			ln.Close()
			<-done
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
		}()
		check(t, newSlots0(t, ln.Addr().String()).Lane("payments"))
	})
	t.Run("cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := newSlots0(t, rd.Addr).Lane("payments").Reserve(cctx, slotReq(interval(100))); !errors.Is(err, context.Canceled) {
			t.Errorf("Reserve with a cancelled context: %v", err)
		}
	})
}

// newSlots0 is newSlots without loading the script (Redis may be down).
func newSlots0(t *testing.T, addr string) *RedisSlots {
	t.Helper()
	rs, err := NewRedisSlots(config.Redis{Addr: addr, KeyPrefix: "test", Timeout: 50 * time.Millisecond, ReplicasHint: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	return rs
}

// TestRedisPauseIsShared: a pause set through one replica holds the slots
// of every replica until its end, and afterwards the schedule restarts from
// the end of the pause with no burst.
func TestRedisPauseIsShared(t *testing.T) {
	rd := startRedis(t)
	a := newSlots(t, rd.Addr).Lane("payments")
	b := newSlots(t, rd.Addr).Lane("payments")
	ctx := context.Background()
	until := time.Now().Add(300 * time.Millisecond)
	if err := a.Pause(ctx, until); err != nil {
		t.Fatal(err)
	}
	if err := a.Pause(ctx, time.Now().Add(100*time.Millisecond)); err != nil { // earlier end: no change
		t.Fatal(err)
	}
	iv := interval(100)
	s1, err := b.Reserve(ctx, slotReq(iv))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := a.Reserve(ctx, slotReq(iv))
	if err != nil {
		t.Fatal(err)
	}
	if d := s1.Sub(until); d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("first slot %v from the pause's end, want 0 ± 1ms", d)
	}
	if d := s2.Sub(s1); d < iv-300*time.Microsecond || d > iv+300*time.Microsecond {
		t.Errorf("second slot %v after the first, want %v", d, iv)
	}
}

// TestCase_C23_GlobalBurst: go-redis/redis_rate#24 — a GCRA burst must cap
// the extra allowance, not add a second rate. Two replicas, each offering
// 2 msgs/s, share 17 per 30 s. Time is scaled by 30 (17/s, offers of
// 60/s, windows of 1 s) so the case runs in seconds; the schedule is
// invariant under that scaling. redis_rate counts the departure itself in
// its burst, shaper's slack does not: burst b is slack b−1.
//   - burst 1 (slack 0): ≤ 18 in [0, 30 s];
//   - slack 1 (SPEC G1's bound floor(W × limit) + 1 + slack): ≤ 19;
//   - burst 17 (slack 16): ≤ 34 in the first 30 s, then ≤ 17 in any later
//     30 s window.
func TestCase_C23_GlobalBurst(t *testing.T) {
	const (
		scale = 30
		limit = 17.0 / 30 * scale // per second
		offer = 2.0 * scale       // per replica, per second
	)
	iv := interval(limit)
	for _, tc := range []struct {
		name       string
		slack      int
		run        time.Duration
		firstBound int
	}{
		{"burst 1 (slack 0)", 0, time.Second + 50*time.Millisecond, 18},
		{"slack 1", 1, time.Second + 50*time.Millisecond, 19},
		{"burst 17 (slack 16)", 16, 2500 * time.Millisecond, 34},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rd := startRedis(t)
			start := time.Now()
			stop := start.Add(tc.run)
			var (
				mu          sync.Mutex
				slots, deps []time.Time
				wg          sync.WaitGroup
				errs        []error
			)
			for range 2 {
				ls := newSlots(t, rd.Addr).Lane("c23")
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, d, _, _, err := consume(ls, drain.SlotRequest{Interval: iv, Slack: tc.slack, MinSpacing: shaper.DefaultMinSpacing},
						stop, interval(offer), nil, 0)
					mu.Lock()
					slots, deps = append(slots, s...), append(deps, d...)
					if err != nil {
						errs = append(errs, err)
					}
					mu.Unlock()
				}()
			}
			wg.Wait()
			if len(errs) > 0 {
				t.Fatal(errs[0])
			}
			slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
			slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
			first := 0
			for _, d := range deps {
				if d.Sub(start) <= time.Second {
					first++
				}
			}
			t.Logf("%d departures in the first (scaled) 30 s, %d in all", first, len(deps))
			if first > tc.firstBound {
				t.Errorf("%d departures in the first 30 s (scaled), bound %d", first, tc.firstBound)
			}
			if tc.slack == 16 {
				// Later windows: after the burst, 17 per window on the
				// schedule (± 0.1 ms of clock conversion), and SPEC G1's
				// 17 + 1 on the departures.
				var later, laterDeps []time.Time
				for i, s := range slots {
					if s.Sub(start) > time.Second {
						later = append(later, s)
					}
					if deps[i].Sub(start) > time.Second {
						laterDeps = append(laterDeps, deps[i])
					}
				}
				// The case's 17 on the schedule itself (its slots are
				// exact): saturated by two consumers, it earns no credit
				// after the first burst. On the departures SPEC G1's bound
				// for a window of 17 whole intervals is 17 + 1 (SPEC wins
				// over the case's 17 there: a departure at the window's
				// far edge is 1 interval, not 0, from the next one).
				if w := maxIn(later, time.Second-100*time.Microsecond); w > 17 {
					t.Errorf("%d slots in a later 30 s window (scaled), want ≤ 17", w)
				}
				if w := maxIn(laterDeps, time.Second); w > 18 {
					t.Errorf("%d departures in a later 30 s window (scaled), bound 18", w)
				}
			}
		})
	}
}

// TestRedisFreshKeyGrantsOnePlusSlack: SPEC G2 across replicas — two
// replicas sharing 10/s with slack 5 on a fresh key get exactly 1 + 5 slots
// before the schedule (at once), the 7th one interval later, then one per
// interval: the make-up lag of a late request does not add to the slack
// (it released 7 in the first 50 ms and 8 in 150 ms before).
func TestRedisFreshKeyGrantsOnePlusSlack(t *testing.T) {
	rd := startRedis(t)
	iv := interval(10)
	req := drain.SlotRequest{Interval: iv, Slack: 5, MinSpacing: shaper.DefaultMinSpacing}
	replicas := []*LaneSlots{newSlots(t, rd.Addr).Lane("fresh"), newSlots(t, rd.Addr).Lane("fresh")}
	var slots []time.Time
	t0 := time.Now()
	for i := range 10 {
		s, err := replicas[i%2].Reserve(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	t1 := time.Now()
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	now := 0 // slots that may leave at once: at or before the reservations
	for _, s := range slots {
		if !s.After(t1) {
			now++
		}
	}
	if now != 6 {
		t.Errorf("%d slots at once on a fresh key with slack 5, want 6 (reserved in %v)", now, t1.Sub(t0))
	}
	for k := 6; k < len(slots); k++ {
		want := t0.Add(time.Duration(k-5) * iv)
		if d := slots[k].Sub(want); d < -time.Millisecond || d > t1.Sub(t0)+time.Millisecond {
			t.Errorf("slot %d at %v after the first reservation, want %v", k, slots[k].Sub(t0), want.Sub(t0))
		}
	}
}

// BenchmarkReserve measures the Redis side of global rates: for each
// limit, the round trips per departure (1 up to 500/s, 1/k above with
// leases of k = floor(2 ms × limit)) and the script calls per second one
// client sustains. Reservations are taken back to back (the schedule runs
// ahead of the clock), so ns/op is the cost of one departure's slot and
// msgs/s the most one lane's loop could reserve.
func BenchmarkReserve(b *testing.B) {
	for _, limit := range []float64{100, 1000, 10000} {
		b.Run(strconv.FormatFloat(limit, 'f', -1, 64)+"/s", func(b *testing.B) {
			rd := startRedis(b)
			rs, err := NewRedisSlots(config.Redis{Addr: rd.Addr, KeyPrefix: "bench", Timeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer rs.Close()
			ls := rs.Lane("bench")
			ctx := context.Background()
			iv := interval(limit)
			if _, err := ls.Reserve(ctx, slotReq(iv)); err != nil {
				b.Fatal(err)
			}
			calls0 := ls.calls.Load()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if _, err := ls.Reserve(ctx, slotReq(iv)); err != nil {
					b.Fatal(err)
				}
			}
			el := time.Since(start).Seconds()
			calls := float64(ls.calls.Load() - calls0)
			b.ReportMetric(calls/float64(b.N), "roundtrips/msg")
			b.ReportMetric(calls/el, "script_calls/s")
			b.ReportMetric(float64(b.N)/el, "msgs/s")
		})
	}
}

// TestRedisClockSteppedBack: when the Redis server's clock steps back
// (emulated here by what a 5 s step leaves in the key: every stored time,
// seen included, 5 s ahead of the server's now), the schedule goes on from
// where it was: the next slot is one interval after the previous one, not
// held for the length of the step. (faketime cannot run Debian's
// redis-server here, docs/lessons.md; the script's rule is the same.)
func TestRedisClockSteppedBack(t *testing.T) {
	rd := startRedis(t)
	rs := newSlots(t, rd.Addr)
	ls := rs.Lane("payments")
	ctx := context.Background()
	iv := interval(50)
	var last time.Time
	var lastAt time.Time // when the last reserve was called: its script ran after that
	for range 5 {
		called := time.Now()
		s, err := ls.Reserve(ctx, slotReq(iv))
		if err != nil {
			t.Fatal(err)
		}
		last, lastAt = s, called
	}
	key := rs.Key("payments")
	vals, err := rs.client.HMGet(ctx, key, "tat", "pause", "seen").Result()
	if err != nil {
		t.Fatal(err)
	}
	shift := func(v any) string {
		f, _ := strconv.ParseFloat(v.(string), 64)
		return strconv.FormatFloat(f+5e6, 'f', 3, 64)
	}
	if err := rs.client.HSet(ctx, key, "tat", shift(vals[0]), "seen", shift(vals[2])).Err(); err != nil {
		t.Fatal(err)
	}
	next, err := ls.Reserve(ctx, slotReq(iv))
	if err != nil {
		t.Fatal(err)
	}
	// The script sees the step as seen − now, which is the step less the
	// time between the two calls (it cannot know more), so the schedule
	// goes on that much later: never earlier (no burst), and late by at
	// most the time between the two scripts' runs, which lies within the
	// time from the last call's start to the next call's return (from the
	// last call's return, one CI run under -race saw 22.6 ms for 20 ms +
	// 0.74 ms: the script had run more than a millisecond before it).
	between := time.Since(lastAt)
	if d := next.Sub(last); d < iv-time.Millisecond || d > iv+between+time.Millisecond {
		t.Errorf("after the clock stepped back 5 s the next slot is %v after the last one, want %v (+ up to %v between the calls)", d, iv, between)
	}
}
