package main

// Field case C15 (overflow NAKs with a delay pin MaxAckPending and stall the
// consumer) end to end, with the case's numbers: a nats-server process with
// JetStream, the shaper binary as a child process (chaosRig) and an HTTP
// downstream on loopback stamping arrivals with the kernel's receive time.

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// c15Config renders the case's lane: source.max_ack_pending 100,
// bucket.capacity 50 with overflow block, the rate limit given, every other
// key at its default (task.max_in_flight 8).
func c15Config(natsURL, admin, sinkURL, limit string) string {
	return fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
log: { level: info, format: text }
shutdown: { drain_timeout: 5s }
downstreams:
  %s:
    source: { stream: %s, subjects: ["chaos.jobs.>"], max_ack_pending: 100 }
    bucket: { capacity: 50, overflow: block }
    rate: { limit: %s }
    sink: { kind: http, url: %q }
`, natsURL, admin, chaosLaneName, chaosStream, limit, sinkURL)
}

// TestCase_C15_NoStallUnderMaxAckPending is field case C15:
// MaxAckPending 100 (source.max_ack_pending), bucket.capacity 50, rate 5/s,
// 500 messages published at t = 0 (t: seconds since the daemon reported
// ready, as this test saw /readyz, at most one 50 ms poll late; the
// messages are published right then). The case's shaper handled overflow
// with NakWithDelay(30 s), whose pending naks pinned MaxAckPending; SPEC §3
// decides overflow differently: with `overflow: block` (the default) the
// lane fetches only into free slots and the backlog waits in the stream, so
// the case's expectation for pull-based flow control applies: 0 overflow
// NAKs. It asserts:
//   - never stalled: ≥ 20 deliveries (arrivals at the downstream) in every
//     5 s span [x, x+5 s) from t = 0 while backlog remains (until the last
//     arrival);
//   - ≥ 140 delivered (answered 2xx) by t = 30 s, and ≤ 6 arrivals in every
//     1 s window before then (G1 at 5/s);
//   - the consumer's NumAckPending ≤ 100 at every poll (every 250 ms), and
//     ≤ capacity + max_in_flight = 58 (G6: block fetches only what the lane
//     can hold);
//   - 0 overflow NAKs: shaper_dead_letters_total{reason="overflow"} 0,
//     shaper_retries_total 0 for every reason, shaper_deliveries_total
//     {outcome="retry"} 0, shaper_redelivered_messages_total 0, the
//     consumer's NumRedelivered 0, and every request is its message's first
//     delivery (X-Shaper-Delivery 1);
//   - all 500 delivered, each exactly once (the ledger: none lost, none
//     twice, none dead-lettered, shaper_deliveries_total{outcome="success"}
//     500).
//
// After the checks at t = 30 s the test raises the rate to 100/s by a hot
// reload of the config file (rename into place, SPEC §3 Hot reload) so that
// the other 350 take seconds, not 70 s; the ledger then checks ≤ 101 in
// every 1 s window. About 40 s of wall clock: behind needCluster.
func TestCase_C15_NoStallUnderMaxAckPending(t *testing.T) {
	needCluster(t)
	const (
		n             = 500
		maxAckPending = 100
		capacity      = 50
		maxInFlight   = 8 // task.max_in_flight's default
	)
	down := newChaosDownstream(t, 0, nil)
	// The rig's config is replaced by the case's (c15Config) before the start.
	r := newChaosRig(t, chaosLane{limit: 5, capacity: capacity, maxInFlight: maxInFlight, ackWait: "60s",
		timeout: "5s", backoff: "[1s, 5s, 30s]", maxDeliver: 5, drainTimeout: "5s"}, down)
	if err := os.WriteFile(r.cfgPath, []byte(c15Config(r.nats.URL(), r.admin, down.url(), "5/s")), 0o600); err != nil {
		t.Fatal(err)
	}
	c := r.startShaper()
	t0 := time.Now()
	r.publish("c15", n)
	t.Logf("published %d in %s after ready", n, time.Since(t0).Round(time.Millisecond))

	var (
		mu                 sync.Mutex
		polls, pollErrors  int
		maxAck             int
		overCase, overHeld []string
	)
	stop := every(t, 250*time.Millisecond, func() {
		info, err := r.consumerInfo()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			pollErrors++
			return
		}
		polls++
		maxAck = max(maxAck, info.NumAckPending)
		at := fmt.Sprintf("%d at t = %.2f s", info.NumAckPending, time.Since(t0).Seconds())
		if info.NumAckPending > maxAckPending {
			overCase = append(overCase, at)
		}
		if info.NumAckPending > capacity+maxInFlight {
			overHeld = append(overHeld, at)
		}
	})

	// t = 30: ≥ 140 delivered, and the 5/s windows.
	sleepUntil(t0, 30.2)
	at30 := 0
	for _, q := range c38Ok(down.requests()) {
		if q.end.Before(t0.Add(30 * time.Second)) {
			at30++
		}
	}
	if at30 < 140 {
		t.Errorf("%d delivered by t = 30 s; want ≥ 140", at30)
	} else {
		t.Logf("%d delivered by t = 30 s", at30)
	}
	var early []time.Time
	for _, q := range down.requests() {
		early = append(early, q.at)
	}
	checkWindows(t, "at 5/s", early, t0, 0, 29, 0, 6)

	// Raise the rate to finish: a new file renamed over the config.
	tmp := filepath.Join(filepath.Dir(r.cfgPath), "config.new.yaml")
	if err := os.WriteFile(tmp, []byte(c15Config(r.nats.URL(), r.admin, down.url(), "100/s")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, r.cfgPath); err != nil {
		t.Fatal(err)
	}
	r.lane.limit = 100 // the ledger's G1 bound from now on
	reloaded := time.Now()
	for {
		s := r.metrics()
		if laneMetric(t, s, "shaper_rate_limit_per_second") == 100 {
			break
		}
		if time.Since(reloaded) > 5*time.Second {
			t.Fatalf("the rate is %v/s 5 s after the config file said 100/s (last reload successful: %v)",
				laneMetric(t, s, "shaper_rate_limit_per_second"), metricValue(t, s, "shaper_config_last_reload_successful", map[string]string{}))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !down.awaitDelivered(n, 30*time.Second) {
		r.awaitAll(time.Second) // fails naming what is missing
	}
	stop()

	reqs := down.requests()
	ok := c38Ok(reqs)
	ts := make([]time.Time, len(reqs))
	for i, q := range reqs {
		ts[i] = q.at
	}
	lastAt := ts[len(ts)-1].Sub(t0).Seconds()
	t.Logf("all %d delivered, the last arriving at t = %.2f s", len(ok), lastAt)
	// Never stalled: every 5 s span while the backlog remained.
	if lo, _ := windowCounts(ts, t0, 0, lastAt-5, 5*time.Second); lo < 20 {
		t.Errorf("a 5 s span starting in [0, %.1f] s holds %d deliveries; want ≥ 20 in every span while backlog remains", lastAt-5, lo)
	} else {
		t.Logf("every 5 s span starting in [0, %.1f] s holds ≥ %d deliveries", lastAt-5, lo)
	}
	mu.Lock()
	t.Logf("%d consumer polls (%d failed): NumAckPending at most %d", polls, pollErrors, maxAck)
	if len(overCase) > 0 {
		t.Errorf("NumAckPending above %d in %d polls: %v", maxAckPending, len(overCase), overCase[:min(10, len(overCase))])
	}
	if len(overHeld) > 0 {
		t.Errorf("NumAckPending above capacity + max_in_flight = %d (G6) in %d polls: %v", capacity+maxInFlight, len(overHeld), overHeld[:min(10, len(overHeld))])
	}
	if polls < 100 {
		t.Errorf("only %d consumer polls succeeded (%d failed); want one every 250 ms", polls, pollErrors)
	}
	mu.Unlock()

	// 0 overflow NAKs, 0 naks of any kind, nothing redelivered.
	if got := c38Redelivered(r); got != 0 {
		t.Errorf("consumer NumRedelivered %d; want 0", got)
	}
	s := r.metrics()
	for _, m := range []struct {
		name  string
		extra []string
		want  float64
	}{
		{"shaper_dead_letters_total", []string{"reason", "overflow"}, 0},
		{"shaper_deliveries_total", []string{"outcome", "retry"}, 0},
		{"shaper_deliveries_total", []string{"outcome", "success"}, n},
		{"shaper_redelivered_messages_total", nil, 0},
	} {
		if got := laneMetric(t, s, m.name, m.extra...); got != m.want {
			t.Errorf("%s%v = %v; want %v", m.name, m.extra, got, m.want)
		}
	}
	if got := laneMetricSum(s, "shaper_retries_total"); got != 0 {
		t.Errorf("shaper_retries_total (all reasons) = %v; want 0", got)
	}
	if got := laneMetricSum(s, "shaper_dead_letters_total"); got != 0 {
		t.Errorf("shaper_dead_letters_total (all reasons) = %v; want 0", got)
	}
	for _, q := range reqs {
		if q.delivery != 1 {
			t.Errorf("%s reached the downstream at delivery %d; want every request to be the first delivery", q.key, q.delivery)
		}
	}
	stopShaper(t, c, 15*time.Second)
	if l := r.reconcile(0); l.delivered != n || l.deadLettered != 0 {
		t.Errorf("%d of %d delivered, %d dead-lettered; want all delivered", l.delivered, n, l.deadLettered)
	}
}
