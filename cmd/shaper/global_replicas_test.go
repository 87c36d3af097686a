package main

import (
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// TestGlobalRateThreeProcesses: issue 5 — three shaper processes on one lane
// with rate.global, one durable consumer and one Redis: the downstream sees
// the shared limit, not three times it, and every message is delivered.
// Behind SHAPERTEST_CLUSTER (22 s; .ci/run sets it): redisslots'
// TestGlobalThreeReplicas keeps the rule in the default suite, three
// replicas in one process on a real redis-server.
func TestGlobalRateThreeProcesses(t *testing.T) {
	needCluster(t)
	redisAddr := testserver.StartRedis(t).Addr
	down := newChaosDownstream(t, 0, nil)
	rig := newChaosRig(t, chaosLane{limit: 150, capacity: 200, maxInFlight: 8, ackWait: "30s", timeout: "5s",
		backoff: "[1s]", maxDeliver: 5, drainTimeout: "2s"}, down)
	var children []*child
	var admins []string
	for i := range 3 {
		admin := freeAddr(t)
		admins = append(admins, admin)
		cfg := fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
redis: { addr: %q, replicas_hint: 3 }
shutdown: { drain_timeout: 2s }
downstreams:
  %s:
    source: { stream: %s, subjects: ["chaos.jobs.>"], ack_wait: 30s, max_ack_pending: 600 }
    bucket: { capacity: 200 }
    rate: { limit: 150/s, global: true }
    task: { timeout: 5s, max_in_flight: 8 }
    sink: { kind: http, url: %q }
`, rig.nats.URL(), admin, redisAddr, chaosLaneName, chaosStream, down.url())
		c := startChild(t, rig.bin, "run", "-c", writeFile(t, "replica"+strconv.Itoa(i)+".yaml", cfg))
		waitReady(t, admin, 20*time.Second)
		children = append(children, c)
	}
	const n = 3000
	rig.publish("g", n)
	if !down.awaitDelivered(n, 40*time.Second) {
		t.Fatalf("only %d of %d delivered", down.delivered(), n)
	}
	reqs := down.requests()
	var ts []time.Time
	for _, r := range reqs {
		ts = append(ts, r.at)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	// G1 holds for what reaches the downstream: at most floor(150) + 1 in
	// any 1 s window, judged at the kernel's receive timestamps
	// (newStampedServer), not at the test's handler times.
	assertRate(t, "1s windows across 3 replicas", ts, time.Second, 151)
	span := ts[len(ts)-1].Sub(ts[0]).Seconds()
	rate := float64(len(ts)-1) / span
	var perReplica []float64
	var dropped, delayed float64
	lane := map[string]string{"lane": chaosLaneName}
	for _, a := range admins {
		s := scrape(t, a)
		perReplica = append(perReplica, metricValue(t, s, "shaper_deliveries_total",
			map[string]string{"lane": chaosLaneName, "outcome": "success"}))
		dropped += metricValue(t, s, "shaper_global_slots_dropped_total", lane)
		delayed += metricValue(t, s, "shaper_global_schedule_delayed_seconds_total", lane)
	}
	// The long-run rate is the shared 150/s, never above it (not 3 × 150),
	// and what the downstream lacks of it is accounted for, slot by slot,
	// by what the replicas report: the slots they dropped because they
	// woke too late for them (more than 1 − min_spacing of an interval:
	// three replicas, their NATS, Redis and this test on 2 cores, and
	// whatever else the machine runs), of which the schedule makes up
	// part, and the time late writes moved the schedule (docs/scaling.md,
	// "Late wake-ups", "Late writes"), plus SPEC G1's 0.5 %. A slot lost
	// any other way fails it. Where few slots were dropped (≤ 2 %), the
	// rate must also be within 3 % of the limit.
	allowed := 150*span + 1
	short := allowed - float64(len(ts))
	accounted := dropped + 150*delayed + 0.005*allowed
	t.Logf("%.0f departures short of the limit over %.2f s; accounted for: %v slots dropped (%.2f %% of departures), "+
		"schedule moved %.1f ms by late writes (%.1f slots), 0.5 %% (%.1f)",
		short, span, dropped, 100*dropped/n, delayed*1e3, 150*delayed, 0.005*allowed)
	if rate > 151.5 {
		t.Errorf("aggregate rate %.1f/s, above the shared 150/s", rate)
	}
	if short > accounted {
		t.Errorf("the downstream got %.0f departures fewer than the limit allows; the replicas account for %.1f of them", short, accounted)
	}
	if dropped <= 0.02*n && rate < 145 {
		t.Errorf("aggregate rate %.1f/s with %v slots dropped, want ≥ 145/s", rate, dropped)
	}
	for _, c := range children {
		stopShaper(t, c, 15*time.Second)
	}
	worst, _ := maxInWindow(ts, time.Second)
	var bins []int
	for _, x := range ts {
		b := int(x.Sub(ts[0]) / time.Second)
		for len(bins) <= b {
			bins = append(bins, 0)
		}
		bins[b]++
	}
	t.Logf("arrivals per second from the first: %v; first gaps %s", bins, gapSummary(ts[:40]))
	t.Logf("3,000 over %.2fs: %.1f/s; worst 1 s window %d; delivered per replica %v", span, rate, worst, perReplica)
	rig.reconcile(3 * 8)
}
