package main

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper/shapertest"
)

// The breaker of SPEC §3 end to end: the daemon on its embedded NATS server,
// a stamped HTTP downstream (arrivals at kernel receive timestamps).

// TestE2EBreakerDownstreamDown: a downstream that answers 503 (no
// Retry-After) for its first 8 s under a backlog of 300. The breaker opens
// after a handful of failures; then only probes reach the downstream, one
// every probe_every (1 s); no message spends max_deliver (nothing is
// dead-lettered, no key is tried more than twice); the first probe after
// the recovery closes it, and the rest arrive through the warmup ramp,
// within SPEC G1's windows, with no burst.
func TestE2EBreakerDownstreamDown(t *testing.T) {
	const (
		limit      = 50.0
		down       = 8 * time.Second
		probeEvery = time.Second
		n          = 300
	)
	var (
		mu    sync.Mutex
		first time.Time
	)
	d := newScripted(t, func(key string, attempt int, since time.Duration) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
		}
		if time.Since(first) < down {
			return 503, ""
		}
		return 204, ""
	})
	daemon := startDaemon(t, laneYAML(t, "{ capacity: 100 }", "{ limit: 50/s, warmup: { period: 2s, cold_factor: 4 } }",
		"{ timeout: 2s, max_in_flight: 4, retry: { backoff: [500ms] }, breaker: { failure_ratio: 0.5, min_attempts: 5, window: 5s, probe_every: 1s } }",
		d.srv.URL))
	waitReady(t, daemon.AdminAddr(), 10*time.Second)
	js := connectJS(t, daemon.NATSURL())
	keys := publishBurst(t, js, "e2e.sem.job", n)

	// Open while the downstream is down, shown by shaper_breaker_open.
	breakerOpen := func() float64 {
		return metricValue(t, scrape(t, daemon.AdminAddr()), "shaper_breaker_open", map[string]string{"lane": "sem"})
	}
	deadline := time.Now().Add(6 * time.Second)
	for breakerOpen() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("shaper_breaker_open not 1 within 6 s of a downstream answering 503")
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.waitDelivered(t, n, 60*time.Second)
	if v := breakerOpen(); v != 0 {
		t.Errorf("shaper_breaker_open %v after everything was delivered, want 0", v)
	}

	calls := d.snapshot()
	var failed, ok []time.Time
	attempts := map[string]int{}
	for _, c := range calls {
		attempts[c.key]++
		if c.status == 503 {
			failed = append(failed, c.at)
		} else {
			ok = append(ok, c.at)
		}
	}
	// The opening: the first gap of more than half a probe_every.
	open := len(failed)
	for i := 1; i < len(failed); i++ {
		if failed[i].Sub(failed[i-1]) > probeEvery/2 {
			open = i
			break
		}
	}
	t.Logf("%d failed calls before the opening, %d probes while down, %d calls in all", open, len(failed)-open, len(calls))
	if open < 5 || open > 5+4 {
		t.Errorf("%d calls before the breaker opened, want min_attempts (5) up to + max_in_flight (4)", open)
	}
	probes := append(failed[open:], ok[0]) // the first success is a probe too
	if len(probes) < 5 {
		t.Fatalf("%d probes in an 8 s outage with probe_every 1s, want ≥ 5", len(probes))
	}
	var gaps []string
	for i := 1; i < len(probes); i++ {
		g := probes[i].Sub(probes[i-1])
		gaps = append(gaps, g.Round(time.Millisecond).String())
		if g < probeEvery-20*time.Millisecond || g > probeEvery+300*time.Millisecond {
			t.Errorf("probe %d arrived %v after probe %d, want about probe_every (1 s)", i, g, i-1)
		}
	}
	t.Logf("gaps between probes at the downstream: %s", strings.Join(gaps, " "))
	if probes[0].Sub(failed[open-1]) < probeEvery-20*time.Millisecond {
		t.Errorf("first probe %v after the last failure, want ≥ probe_every", probes[0].Sub(failed[open-1]))
	}
	// Nothing spent max_deliver (5): no key was tried more than twice (one
	// failure, or one probe, then the success), nothing is a dead letter.
	most := 0
	for _, a := range attempts {
		most = max(most, a)
	}
	if most > 2 {
		t.Errorf("a key was tried %d times, want ≤ 2: held messages must not spend deliveries", most)
	}
	if dl := deadLetters(t, js, 1, 2*time.Second); len(dl) != 0 {
		t.Errorf("dead letters %v, want none", dl)
	}
	delivered := d.delivered()
	for _, k := range keys {
		if delivered[k] == 0 {
			t.Errorf("%s never delivered", k)
		}
	}
	// After the closing probe: the ramp from cold (12.5/s to 50/s over 2 s;
	// +2 as in TestE2EColdStartWarmup: SPEC's +1, and x counted from the
	// closing probe's arrival), SPEC G1's windows, no burst.
	integral := func(x float64) float64 {
		if x <= 2 {
			return 12.5*x + 37.5*x*x/4
		}
		return 12.5*2 + 37.5 + limit*(x-2)
	}
	for i, at := range ok {
		if x := at.Sub(ok[0]).Seconds(); float64(i+1) > integral(x)+2 {
			t.Fatalf("arrival %d, %.3f s after the closing probe, exceeds the ramp's integral + 2 (%.1f)", i+1, x, integral(x)+2)
		}
	}
	for _, w := range []time.Duration{100 * time.Millisecond, time.Second} {
		assertRate(t, "after the close", ok, w, shapertest.BoundWhole(w, limit, 0))
	}
	if g, i := shapertest.MinGap(ok); g < time.Duration(0.5*float64(time.Second)/limit) {
		t.Errorf("arrivals %d and %d after the close %v apart: a burst", i-1, i, g)
	}
	tail := ok[len(ok)-150:]
	rate := float64(len(tail)-1) / tail[len(tail)-1].Sub(tail[0]).Seconds()
	t.Logf("after the ramp: %.2f/s over the last 150 arrivals (limit %v/s)", rate, limit)
	if math.Abs(rate-limit)/limit > 0.02 {
		t.Errorf("rate after the ramp %.2f/s, want %v/s", rate, limit)
	}
	waitConsumerSettled(t, js, "E2E_SEM", "shaper-sem", 10*time.Second)
	logs := daemon.logs.String()
	if o, c := strings.Count(logs, "breaker opened"), strings.Count(logs, "breaker closed by a successful probe"); o != 1 || c != 1 {
		t.Errorf("breaker opened logged %d times, closed %d times; want once each", o, c)
	}
}

// TestE2EBreakerGoneHoldsUntilReset: one 410 Gone holds the lane with no
// probes until an operator's resume (shaper resume, through the admin API;
// shaper lanes shows it open meanwhile); the 410'd message is dead-lettered rejected_by_sink;
// after the reset the rest arrive at the rate.
func TestE2EBreakerGoneHoldsUntilReset(t *testing.T) {
	const limit = 20.0
	var (
		mu   sync.Mutex
		gone bool
	)
	d := newScripted(t, func(key string, attempt int, since time.Duration) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if !gone {
			gone = true
			return 410, ""
		}
		return 204, ""
	})
	daemon := startDaemon(t, laneYAML(t, "{ capacity: 100 }", "{ limit: 20/s }",
		"{ timeout: 2s, max_in_flight: 1, breaker: { failure_ratio: 0.5, min_attempts: 5, window: 5s, probe_every: 500ms } }",
		d.srv.URL))
	waitReady(t, daemon.AdminAddr(), 10*time.Second)
	js := connectJS(t, daemon.NATSURL())
	publishBurst(t, js, "e2e.sem.job", 50)
	deadline := time.Now().Add(10 * time.Second)
	for len(d.snapshot()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no request reached the downstream")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(4 * time.Second) // 8 probe_every
	if n := len(d.snapshot()); n != 1 {
		t.Errorf("%d requests in the 4 s after a 410, want 1 (held, no probes)", n)
	}
	s := scrape(t, daemon.AdminAddr())
	if v := metricValue(t, s, "shaper_breaker_open", map[string]string{"lane": "sem"}); v != 1 {
		t.Errorf("shaper_breaker_open %v while held, want 1", v)
	}
	if !strings.Contains(daemon.logs.String(), "410 Gone; departures wait for an operator's resume") {
		t.Error("the log does not say the lane waits for an operator's resume")
	}
	var out, errb strings.Builder
	if code := run([]string{"lanes", "--admin", "http://" + daemon.AdminAddr()}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "open") || !strings.Contains(out.String(), "410 Gone") {
		t.Errorf("shaper lanes while held: exit %d, %q; want the lane open, held after a 410", code, out.String())
	}
	reset := time.Now()
	out.Reset()
	if code := run([]string{"resume", "sem", "--admin", "http://" + daemon.AdminAddr()}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "running") {
		t.Fatalf("shaper resume: exit %d, %q %q; want the lane running", code, out.String(), errb.String())
	}
	d.waitDelivered(t, 49, 15*time.Second)
	var after []time.Time
	for _, c := range d.snapshot() {
		if c.at.After(reset) {
			after = append(after, c.at)
		}
	}
	if len(after) != 49 {
		t.Errorf("%d arrivals after the reset, want 49", len(after))
	}
	for _, w := range []time.Duration{200 * time.Millisecond, time.Second} {
		assertRate(t, "after the reset", after, w, shapertest.BoundWhole(w, limit, 0))
	}
	dl := deadLetters(t, js, 1, 5*time.Second)
	if len(dl) != 1 {
		t.Fatalf("dead letters %v, want the one answered 410", dl)
	}
	for k, reason := range dl {
		if reason != "rejected_by_sink" {
			t.Errorf("dead letter %s reason %q, want rejected_by_sink", k, reason)
		}
	}
	if !strings.Contains(daemon.logs.String(), "breaker closed by an operator's resume") {
		t.Error("the reset is not logged")
	}
	if _, err := daemon.ResetBreaker("nope"); err == nil {
		t.Error("ResetBreaker of an unknown lane did not fail")
	}
}
