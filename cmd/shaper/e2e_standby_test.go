package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/sources"
)

// needCluster skips a long run unless SHAPER_TEST_CLUSTER=1 (.ci/run sets
// it).
func needCluster(t *testing.T) {
	t.Helper()
	if os.Getenv("SHAPER_TEST_CLUSTER") != "1" {
		t.Skip("a long run: set SHAPER_TEST_CLUSTER=1 (.ci/run does)")
	}
}

// TestStandbyKillActive: SPEC §3 Standby, issue 13 — three shaper processes
// on one standby lane and one NATS server. Only one delivers; kill -9 of it
// under a backlog: another takes over within the documented time
// (sources.StandbyTakeover, plus the interval the new one waits and the one
// the dead one may have left unused), the downstream sees ≤ limit + 1 in
// every 1 s window across the takeover (kernel timestamps), and every
// message is delivered (the dead one's bucket comes back after ack_wait).
func TestStandbyKillActive(t *testing.T) {
	needCluster(t)
	const limit = 20.0
	down := newChaosDownstream(t, 0, nil)
	rig := newChaosRig(t, chaosLane{limit: limit, capacity: 20, maxInFlight: 4, ackWait: "5s", timeout: "2s",
		backoff: "[1s]", maxDeliver: 5, drainTimeout: "2s"}, down)
	var children []*child
	var admins []string
	for i := range 3 {
		admin := freeAddr(t)
		admins = append(admins, admin)
		cfg := fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
shutdown: { drain_timeout: 2s }
downstreams:
  %s:
    source: { stream: %s, subjects: ["chaos.jobs.>"], ack_wait: 5s, standby: true }
    bucket: { capacity: 20 }
    rate: { limit: %v/s }
    task: { timeout: 2s, max_in_flight: 4 }
    sink: { kind: http, url: %q }
`, rig.nats.url(), admin, chaosLaneName, chaosStream, limit, down.url())
		children = append(children, startChild(t, rig.bin, "run", "-c", writeFile(t, "replica"+strconv.Itoa(i)+".yaml", cfg)))
		waitReady(t, admin, 20*time.Second)
	}
	const n = 300
	rig.publish("s", n)
	if !down.awaitDelivered(60, 20*time.Second) {
		t.Fatalf("only %d delivered before the kill", down.delivered())
	}
	departures := func(i int) float64 {
		return metricValue(t, scrape(t, admins[i]), "shaper_departures_total", map[string]string{"lane": chaosLaneName})
	}
	active := -1
	for i := range admins {
		if d := departures(i); d > 0 {
			if active >= 0 {
				t.Fatalf("replicas %d and %d both departed before the kill", active, i)
			}
			active = i
		}
	}
	if active < 0 {
		t.Fatal("no replica departed")
	}
	killed := time.Now()
	_ = children[active].cmd.Process.Kill() // SIGKILL
	<-children[active].done
	if !down.awaitDelivered(n, 60*time.Second) {
		t.Fatalf("only %d of %d delivered after the kill", down.delivered(), n)
	}
	reqs := down.requests()
	ts := make([]time.Time, len(reqs))
	for i, q := range reqs {
		ts[i] = q.at
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	// The takeover: the largest gap at the downstream after the kill began
	// with the dead one's last arrival.
	var last, next time.Time
	for i, at := range ts {
		if at.After(killed) {
			next = at
			if i > 0 {
				last = ts[i-1]
			}
			break
		}
	}
	gap := next.Sub(last)
	iv := time.Duration(float64(time.Second) / limit)
	bound := sources.StandbyTakeover + 2*iv + 250*time.Millisecond // scheduling margin on 2 loaded cores
	t.Logf("takeover: %v from the dead replica's last arrival to the next one (%v after the kill); bound %v",
		gap.Round(time.Millisecond), next.Sub(killed).Round(time.Millisecond), bound)
	if next.IsZero() || gap > bound {
		t.Errorf("takeover gap %v, want ≤ %v", gap, bound)
	}
	var took []int
	for i := range admins {
		if i != active {
			if departures(i) > 0 {
				took = append(took, i)
			}
		}
	}
	if len(took) != 1 {
		t.Errorf("after the kill %d replicas departed (%v), want exactly one", len(took), took)
	}
	for i, c := range children {
		if i != active {
			stopShaper(t, c, 15*time.Second)
		}
	}
	// G1 across the takeover at limit + 1 per 1 s window, nothing lost;
	// duplicates: what the dead one had in flight (max_in_flight).
	rig.reconcile(4)
}
