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

// needCluster skips a long run unless SHAPERTEST_CLUSTER=1 (.ci/run sets
// it).
func needCluster(t *testing.T) {
	t.Helper()
	if os.Getenv("SHAPERTEST_CLUSTER") != "1" {
		t.Skip("a long run: set SHAPERTEST_CLUSTER=1 (.ci/run does)")
	}
}

// TestStandbyKillActive: SPEC §3 Standby, issue 13 — three shaper processes
// on one standby lane and one NATS server. Only one delivers; kill -9 of it
// under a backlog: another takes over within the documented time
// (sources.StandbyTakeover, plus the interval the new one waits and the one
// the dead one may have left unused); then SIGTERM of that one: it drains,
// and the third takes over within the same time. The downstream sees
// ≤ limit + 1 in every 1 s window across both takeovers (kernel
// timestamps), and every message is delivered (the dead one's bucket comes
// back after ack_wait, the drained one's at once).
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
`, rig.nats.URL(), admin, chaosLaneName, chaosStream, limit, down.url())
		children = append(children, startChild(t, rig.bin, "run", "-c", writeFile(t, "replica"+strconv.Itoa(i)+".yaml", cfg)))
		waitReady(t, admin, 20*time.Second)
	}
	const n = 400
	rig.publish("s", n)
	departures := func(i int) float64 {
		return metricValue(t, scrape(t, admins[i]), "shaper_departures_total", map[string]string{"lane": chaosLaneName})
	}
	alive := map[int]bool{0: true, 1: true, 2: true}
	// activeOne returns the one live replica whose departures grew since
	// before; it fails when there is not exactly one.
	activeOne := func(before map[int]float64) int {
		t.Helper()
		a := -1
		for i := range admins {
			if !alive[i] {
				continue
			}
			if d := departures(i); d > before[i] {
				if a >= 0 {
					t.Fatalf("replicas %d and %d both departed", a, i)
				}
				a = i
			}
		}
		if a < 0 {
			t.Fatal("no replica departed")
		}
		return a
	}
	iv := time.Duration(float64(time.Second) / limit)
	// takeover measures the gap at the downstream around the stop at
	// stopped: from the last arrival before it to the first after it.
	takeover := func(what string, stopped time.Time) {
		t.Helper()
		reqs := down.requests()
		ts := make([]time.Time, len(reqs))
		for i, q := range reqs {
			ts[i] = q.at
		}
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		// The largest gap between consecutive arrivals from the last one
		// before the stop on: a drain departs its bucket first.
		var gap time.Duration
		var next time.Time
		for i := 1; i < len(ts); i++ {
			if ts[i].After(stopped) && ts[i].Sub(stopped) < 15*time.Second {
				if g := ts[i].Sub(ts[i-1]); g > gap {
					gap, next = g, ts[i]
				}
			}
		}
		bound := sources.StandbyTakeover + 2*iv + 250*time.Millisecond // scheduling margin on 2 loaded cores
		t.Logf("%s: largest gap %v at the downstream, ending %v after the stop; bound %v",
			what, gap.Round(time.Millisecond), next.Sub(stopped).Round(time.Millisecond), bound)
		if next.IsZero() || gap > bound {
			t.Errorf("%s: takeover gap %v, want ≤ %v", what, gap, bound)
		}
	}
	snapshot := func() map[int]float64 {
		m := map[int]float64{}
		for i := range admins {
			if alive[i] {
				m[i] = departures(i)
			}
		}
		return m
	}

	// 1. kill -9 of the active one under the backlog.
	if !down.awaitDelivered(60, 20*time.Second) {
		t.Fatalf("only %d delivered before the kill", down.delivered())
	}
	first := activeOne(map[int]float64{})
	killed := time.Now()
	_ = children[first].cmd.Process.Kill() // SIGKILL
	<-children[first].done
	alive[first] = false
	before := snapshot()
	if !down.awaitDelivered(180, 30*time.Second) {
		t.Fatalf("only %d delivered after the kill", down.delivered())
	}
	takeover("kill -9", killed)
	second := activeOne(before)

	// 2. SIGTERM of the new active one: it drains at the lane's rate,
	// hands back the rest, and the last one takes over.
	stopped := time.Now()
	stopShaper(t, children[second], 15*time.Second)
	alive[second] = false
	before = snapshot()
	if !down.awaitDelivered(n, 60*time.Second) {
		t.Fatalf("only %d of %d delivered after the stop", down.delivered(), n)
	}
	takeover("SIGTERM (drain)", stopped)
	third := activeOne(before)
	stopShaper(t, children[third], 15*time.Second)
	// G1 across the takeover at limit + 1 per 1 s window, nothing lost;
	// duplicates: what the dead one had in flight (max_in_flight).
	rig.reconcile(4)
}
