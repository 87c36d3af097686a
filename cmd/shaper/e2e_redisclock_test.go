package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// TestGlobalRateRedisClockSteps: issue 13, Redis in the ways it fails — the
// Redis server's wall clock (the shared schedule's clock) is stepped under
// two shaper processes sharing a 50/s lane: 5 s back, then 5 s ahead (to
// the real time), then 5 s ahead again (libfaketime on the real
// redis-server, testserver.WithSteppableClock). No stall longer than a
// second (a step back without the script's correction held every replica
// for the step's length), no burst: every 1 s window at the downstream
// ≤ 51 + 1 (a step ahead looks like idle time: the schedule frees 1 + slack
// slots at once, docs/scaling.md "Clocks") + 1 (the downstream allowance of
// docs/scaling.md), and nothing lost.
func TestGlobalRateRedisClockSteps(t *testing.T) {
	needCluster(t)
	const (
		limit    = 50.0
		replicas = 2
	)
	redis := testserver.StartRedis(t, testserver.WithSteppableClock(t))
	down := newChaosDownstream(t, 0, nil)
	rig := newChaosRig(t, chaosLane{limit: limit, capacity: 100, maxInFlight: 8, ackWait: "30s", timeout: "5s",
		backoff: "[1s]", maxDeliver: 5, drainTimeout: "2s"}, down)
	var children []*child
	for i := range replicas {
		admin := freeAddr(t)
		cfg := fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
redis: { addr: %q, replicas_hint: %d }
shutdown: { drain_timeout: 2s }
downstreams:
  %s:
    source: { stream: %s, subjects: ["chaos.jobs.>"], ack_wait: 30s, max_ack_pending: 300 }
    bucket: { capacity: 100 }
    rate: { limit: %v/s, global: true }
    task: { timeout: 5s, max_in_flight: 8 }
    sink: { kind: http, url: %q }
`, rig.nats.URL(), admin, redis.Addr, replicas, chaosLaneName, chaosStream, limit, down.url())
		children = append(children, startChild(t, rig.bin, "run", "-c", writeFile(t, "replica"+strconv.Itoa(i)+".yaml", cfg)))
		waitReady(t, admin, 20*time.Second)
	}
	const n = 1000
	rig.publish("k", n)
	began := time.Now()
	at := func(d time.Duration) { time.Sleep(time.Until(began.Add(d))) }
	steps := []struct {
		at     time.Duration
		offset time.Duration
	}{{5 * time.Second, -5 * time.Second}, {10 * time.Second, 0}, {15 * time.Second, 5 * time.Second}}
	var stepped []time.Time
	for _, s := range steps {
		at(s.at)
		stepped = append(stepped, time.Now())
		redis.StepClock(s.offset)
		t.Logf("redis clock at real %+v from %v", s.offset, time.Since(began).Round(time.Millisecond))
	}

	if !down.awaitDelivered(n, 60*time.Second) {
		t.Fatalf("only %d of %d delivered", down.delivered(), n)
	}
	var fallback []string
	for i, c := range children {
		fallback = append(fallback, fmt.Sprintf("replica %d: %d fallback lines", i, strings.Count(c.stderrText(), "global rate unavailable")))
	}
	ts, worst, maxGap := stopAndStamps(t, down, children) // e2e_sentinel_test.go
	var around []string
	for i, s := range stepped {
		g, _ := largestGap(ts, s.Add(-time.Second), s.Add(3*time.Second))
		w, _ := maxInWindow(within(ts, s.Add(-time.Second), s.Add(3*time.Second)), time.Second)
		around = append(around, fmt.Sprintf("step to %+v: largest gap %v, worst window %d", steps[i].offset, g.Round(time.Millisecond), w))
	}
	span := ts[len(ts)-1].Sub(ts[0]).Seconds()
	t.Logf("%d over %.2fs: %.1f/s; worst 1 s window %d; largest gap %v; %v; %v", len(ts), span,
		float64(len(ts)-1)/span, worst, maxGap.Round(time.Millisecond), around, fallback)
	t.Logf("per second from the first arrival: %v", perSecond(ts))
	assertRate(t, "1s windows across the clock steps", ts, time.Second, 53)
	if maxGap > time.Second {
		t.Errorf("a gap of %v at the downstream, want ≤ 1s (no stall)", maxGap)
	}
	rig.lane.limit = 52 // reconcile's window bound is limit + 1; the window was judged above
	rig.reconcile(0)
}

// within returns the instants of ts (sorted) in [from, to).
func within(ts []time.Time, from, to time.Time) []time.Time {
	i := sort.Search(len(ts), func(i int) bool { return !ts[i].Before(from) })
	j := sort.Search(len(ts), func(i int) bool { return !ts[i].Before(to) })
	return ts[i:j]
}

// perSecond counts ts (sorted) in consecutive 1 s buckets from the first
// (diagnostics for the logs: where a run lost rate).
func perSecond(ts []time.Time) []int {
	if len(ts) == 0 {
		return nil
	}
	var out []int
	for _, x := range ts {
		i := int(x.Sub(ts[0]) / time.Second)
		for len(out) <= i {
			out = append(out, 0)
		}
		out[i]++
	}
	return out
}
