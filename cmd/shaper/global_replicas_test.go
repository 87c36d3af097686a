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
func TestGlobalRateThreeProcesses(t *testing.T) {
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
	// The long-run rate must be the shared 150/s, not 3 × 150. The floor is
	// loosened to −3 % for a CI machine running other packages at once.
	if rate > 151.5 || rate < 145 {
		t.Errorf("aggregate rate %.1f/s, want ~150/s", rate)
	}
	var perReplica []float64
	for _, a := range admins {
		perReplica = append(perReplica, metricValue(t, scrape(t, a), "shaper_deliveries_total",
			map[string]string{"lane": chaosLaneName, "outcome": "success"}))
	}
	for _, c := range children {
		stopShaper(t, c, 15*time.Second)
	}
	worst, _ := maxInWindow(ts, time.Second)
	t.Logf("3,000 over %.2fs: %.1f/s; worst 1 s window %d; delivered per replica %v", span, rate, worst, perReplica)
	rig.reconcile(3 * 8)
}
