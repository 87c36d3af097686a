package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// TestGlobalRateSentinelClockSteps: issue 13's proof of "Redis in the ways it
// fails" as one scenario — two shaper processes share a 50/s lane through
// Redis behind Sentinel (a primary and a replica, both under libfaketime,
// testserver.WithSteppableClock). Under a backlog: SENTINEL FAILOVER; kill -9
// of the master (Sentinel fails over; the killed one is started again empty,
// a replica); then the master's clock is stepped 5 s back, 5 s ahead (to the
// real time) and 5 s ahead again. In every 1 s window at the downstream
// ≤ 51 + 1 (the downstream allowance of docs/scaling.md) + 1 (the fallback's
// N − 1, or the step ahead's 1 + slack), no gap over 1 s, nothing lost.
func TestGlobalRateSentinelClockSteps(t *testing.T) {
	needCluster(t)
	const (
		limit    = 50.0
		replicas = 2
	)
	primary := testserver.StartRedis(t, testserver.WithSteppableClock(t), testserver.WithRedisArgs("--repl-diskless-sync-delay", "0"))
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica := testserver.StartRedis(t, testserver.WithSteppableClock(t),
		testserver.WithRedisArgs("--replicaof", host, port, "--repl-diskless-sync-delay", "0"))
	sentinel := testserver.StartSentinel(t, "shaper", primary.Addr, 500*time.Millisecond)
	awaitSentinelReplica(t, sentinel, replica.Addr)

	down := newChaosDownstream(t, 0, nil)
	rig := newChaosRig(t, chaosLane{limit: limit, capacity: 100, maxInFlight: 8, ackWait: "30s", timeout: "5s",
		backoff: "[1s]", maxDeliver: 5, drainTimeout: "2s"}, down)
	var children []*child
	for i := range replicas {
		admin := freeAddr(t)
		cfg := fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
redis: { addr: %q, master_name: shaper, replicas_hint: %d }
shutdown: { drain_timeout: 2s }
downstreams:
  %s:
    source: { stream: %s, subjects: ["chaos.jobs.>"], ack_wait: 30s, max_ack_pending: 300 }
    bucket: { capacity: 100 }
    rate: { limit: %v/s, global: true }
    task: { timeout: 5s, max_in_flight: 8 }
    sink: { kind: http, url: %q }
`, rig.nats.URL(), admin, sentinel.Addr, replicas, chaosLaneName, chaosStream, limit, down.url())
		children = append(children, startChild(t, rig.bin, "run", "-c", writeFile(t, "replica"+strconv.Itoa(i)+".yaml", cfg)))
		waitReady(t, admin, 20*time.Second)
	}
	const n = 1500
	rig.publish("s", n)
	began := time.Now()
	at := func(d time.Duration) { time.Sleep(time.Until(began.Add(d))) }
	type event struct {
		what string
		at   time.Time
	}
	var events []event
	mark := func(what string) {
		events = append(events, event{what, time.Now()})
		t.Logf("%s at %v", what, time.Since(began).Round(time.Millisecond))
	}

	at(4 * time.Second)
	mark("SENTINEL FAILOVER")
	sentinel.Failover("shaper")
	awaitMaster(t, sentinel, replica.Addr)

	at(9 * time.Second)
	mark("kill -9 of the master")
	replica.Kill()
	awaitMaster(t, sentinel, primary.Addr)
	replica.Start() // empty (no persistence), a replica of the old primary again

	for i, step := range []time.Duration{-5 * time.Second, 0, 5 * time.Second} {
		at(time.Duration(15+5*i) * time.Second)
		mark(fmt.Sprintf("master's clock to real %+v", step))
		primary.StepClock(step)
	}

	if !down.awaitDelivered(n, 60*time.Second) {
		t.Fatalf("only %d of %d delivered", down.delivered(), n)
	}
	var fallback []string
	for i, c := range children {
		fallback = append(fallback, fmt.Sprintf("replica %d: %d fallback lines", i, strings.Count(c.stderrText(), "global rate unavailable")))
		for _, l := range strings.Split(c.stderrText(), "\n") {
			if strings.Contains(l, "global rate") || strings.Contains(l, "redis answers") {
				t.Logf("replica %d: %s", i, l)
			}
		}
	}
	ts, worst, maxGap := stopAndStamps(t, down, children) // e2e_sentinel_test.go
	var around []string
	for _, e := range events {
		g, _ := largestGap(ts, e.at.Add(-time.Second), e.at.Add(3*time.Second))
		w, _ := maxInWindow(within(ts, e.at.Add(-time.Second), e.at.Add(3*time.Second)), time.Second)
		around = append(around, fmt.Sprintf("%s: largest gap %v, worst window %d", e.what, g.Round(time.Millisecond), w))
	}
	span := ts[len(ts)-1].Sub(ts[0]).Seconds()
	t.Logf("%d over %.2fs: %.1f/s; worst 1 s window %d; largest gap %v; %v", len(ts), span,
		float64(len(ts)-1)/span, worst, maxGap.Round(time.Millisecond), fallback)
	t.Logf("around each event: %v", around)
	t.Logf("per second from the first arrival: %v", perSecond(ts))
	assertRate(t, "1s windows across the failover, the kill and the clock steps", ts, time.Second, 53)
	if maxGap > time.Second {
		t.Errorf("a gap of %v at the downstream, want ≤ 1s (no stall)", maxGap)
	}
	rig.lane.limit = 52 // reconcile's window bound is limit + 1; the window was judged above
	rig.reconcile(0)
}
