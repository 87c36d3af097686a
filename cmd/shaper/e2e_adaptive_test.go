package main

import (
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// The adaptive rate and the quota of SPEC §3 end to end: the daemon on its
// embedded NATS server, HTTP downstreams judged at kernel receive
// timestamps (newStampedServer).

// wallDownstream accepts up to rate requests per second, by a token bucket
// of its own (burst 3) run on the kernel receive timestamps, and answers 429
// (without Retry-After) above.
type wallDownstream struct {
	mu     sync.Mutex
	rate   float64
	tokens float64
	last   time.Time
	calls  []scriptedCall
}

func newWallDownstream(t *testing.T, rate float64) (*wallDownstream, string) {
	d := &wallDownstream{rate: rate, tokens: 3}
	srv := newStampedServer(t, func(w http.ResponseWriter, r *http.Request, at time.Time) {
		d.mu.Lock()
		if !d.last.IsZero() && at.After(d.last) {
			d.tokens = math.Min(3, d.tokens+at.Sub(d.last).Seconds()*d.rate)
		}
		if at.After(d.last) {
			d.last = at
		}
		status := http.StatusNoContent
		if d.tokens >= 1 {
			d.tokens--
		} else {
			status = http.StatusTooManyRequests
		}
		d.calls = append(d.calls, scriptedCall{at: at, key: r.Header.Get("Idempotency-Key"), status: status})
		d.mu.Unlock()
		w.WriteHeader(status)
	})
	return d, srv.URL
}

func (d *wallDownstream) snapshot() []scriptedCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := slices.Clone(d.calls)
	slices.SortStableFunc(c, func(x, y scriptedCall) int { return x.at.Compare(y.at) })
	return c
}

// TestE2EAdaptiveFindsTheWall: SPEC §3 Adaptive rate, the proof — a
// downstream that accepts up to 60/s and answers 429 above, a lane at
// limit 100/s with adaptive.min 10/s under a backlog: from 20 s after the
// first call on, the rate the downstream accepts stays within 52–60/s (in
// every 5 s window, and over the whole window) and fewer than 2 % of the
// calls get a 429; the rate in force shows in shaper_rate_limit_per_second
// and /v1/lanes; no 1 s window holds more than limit + 1 (G1 never above
// limit).
func TestE2EAdaptiveFindsTheWall(t *testing.T) {
	const (
		wall    = 60.0
		settle  = 20 * time.Second
		measure = 25 * time.Second
	)
	d, url := newWallDownstream(t, wall)
	daemon := startDaemon(t, laneYAML(t, "{ capacity: 200 }", "{ limit: 100/s, adaptive: { min: 10/s } }",
		"{ timeout: 2s, max_in_flight: 8, retry: { backoff: [1s] } }", url+"/callback"))
	waitReady(t, daemon.AdminAddr(), 10*time.Second)
	js := connectJS(t, daemon.NATSURL())
	publishBurst(t, js, "e2e.sem.job", 3000)
	deadline := time.Now().Add(10 * time.Second)
	for len(d.snapshot()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no call within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	first := d.snapshot()[0].at
	time.Sleep(time.Until(first.Add(settle + measure)))
	metric := metricValue(t, scrape(t, daemon.AdminAddr()), "shaper_rate_limit_per_second", map[string]string{"lane": "sem"})
	view := apiLane(t, daemon.AdminAddr(), "sem")
	calls := d.snapshot()

	from, to := first.Add(settle), first.Add(settle+measure)
	var n, rejected, accepted int
	perWindow := map[int]int{}
	var ts []time.Time
	for _, c := range calls {
		ts = append(ts, c.at)
		if c.at.Before(from) || !c.at.Before(to) {
			continue
		}
		n++
		if c.status == http.StatusTooManyRequests {
			rejected++
			continue
		}
		accepted++
		perWindow[int(c.at.Sub(from)/(5*time.Second))]++
	}
	rate := float64(accepted) / measure.Seconds()
	share := float64(rejected) / float64(n)
	t.Logf("from %v to %v after the first call: %d calls, %.2f/s accepted, %d got 429 (%.2f %%); windows of 5 s: %v; rate in force: metric %.2f/s, /v1/lanes %.2f/s",
		settle, settle+measure, n, rate, rejected, 100*share, perWindow, metric, view.Rate)
	if rate < 52 || rate > 60 {
		t.Errorf("accepted %.2f/s after convergence, want within 52–60/s", rate)
	}
	for w := range int(measure / (5 * time.Second)) {
		if r := float64(perWindow[w]) / 5; r < 52 || r > 60.6 { // 60/s + the downstream's burst over 5 s
			t.Errorf("5 s window %d: accepted %.2f/s, want within 52–60/s", w, r)
		}
	}
	if share >= 0.02 {
		t.Errorf("%.2f %% of the calls got a 429 after convergence, want < 2 %%", 100*share)
	}
	if metric < 50 || metric > 66 || math.Abs(view.Rate-metric) > 3 {
		t.Errorf("rate in force: shaper_rate_limit_per_second %.2f/s, /v1/lanes rate_per_second %.2f/s; want both near the wall (50–66/s)", metric, view.Rate)
	}
	if view.Limit != 100 {
		t.Errorf("/v1/lanes limit_per_second %v, want the configured 100", view.Limit)
	}
	if m, at := maxInWindow(ts, time.Second); m > 101 {
		t.Errorf("%d calls in the 1 s window at %v, above limit + 1", m, at.Sub(first))
	}
}

// TestE2EAdaptiveSpentBudgetWaitsForReset: SPEC §3 Adaptive rate — a
// downstream that answers its 10th call with RateLimit-Remaining: 0 and
// RateLimit-Reset: 3 gets no call until the reset, then calls resume at the
// lane's rate with no burst; /v1/lanes and shaper_lane_paused show the wait.
func TestE2EAdaptiveSpentBudgetWaitsForReset(t *testing.T) {
	var (
		mu    sync.Mutex
		calls []scriptedCall
		spent time.Time // when the 10th call was answered
	)
	srv := newStampedServer(t, func(w http.ResponseWriter, r *http.Request, at time.Time) {
		mu.Lock()
		calls = append(calls, scriptedCall{at: at, key: r.Header.Get("Idempotency-Key"), status: 204})
		tenth := len(calls) == 10
		mu.Unlock()
		w.Header().Set("RateLimit-Limit", "100")
		if tenth {
			w.Header().Set("RateLimit-Remaining", "0")
			w.Header().Set("RateLimit-Reset", "3")
			mu.Lock()
			spent = time.Now()
			mu.Unlock()
		} else {
			w.Header().Set("RateLimit-Remaining", "50")
			w.Header().Set("RateLimit-Reset", "1")
		}
		w.WriteHeader(http.StatusNoContent)
	})
	daemon := startDaemon(t, laneYAML(t, "{ capacity: 100 }", "{ limit: 20/s, adaptive: { min: 1/s, headers: true } }",
		"{ timeout: 2s, max_in_flight: 4 }", srv.URL+"/callback"))
	waitReady(t, daemon.AdminAddr(), 10*time.Second)
	js := connectJS(t, daemon.NATSURL())
	publishBurst(t, js, "e2e.sem.job", 80)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		s := spent
		mu.Unlock()
		if !s.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("10 calls not reached within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(time.Second)
	paused := metricValue(t, scrape(t, daemon.AdminAddr()), "shaper_lane_paused", map[string]string{"lane": "sem"})
	view := apiLane(t, daemon.AdminAddr(), "sem")
	time.Sleep(4 * time.Second)
	mu.Lock()
	got := slices.Clone(calls)
	s := spent
	mu.Unlock()
	slices.SortStableFunc(got, func(x, y scriptedCall) int { return x.at.Compare(y.at) })
	if len(got) < 20 {
		t.Fatalf("%d calls", len(got))
	}
	next := got[10].at
	t.Logf("10th call at %v, answered with Remaining 0 at +%v; call 11 at +%v after the answer, call 12 %v later",
		got[9].at.Format("15:04:05.000"), s.Sub(got[9].at), next.Sub(s), got[11].at.Sub(next))
	if next.Before(s.Add(3 * time.Second)) {
		t.Errorf("call 11 came %v after the answer that spent the budget, want ≥ 3 s (the reset)", next.Sub(s))
	}
	if next.After(s.Add(3*time.Second + 200*time.Millisecond)) {
		t.Errorf("call 11 came %v after the answer, want soon after the 3 s reset", next.Sub(s))
	}
	if g := got[11].at.Sub(next); g < 45*time.Millisecond {
		t.Errorf("gap after the reset %v, want about one interval (50 ms): no burst", g)
	}
	if view.QuotaRemaining != nil {
		t.Errorf("/v1/lanes quota_remaining %v without a quota, want null", *view.QuotaRemaining)
	}
	if paused != 1 || view.State != "paused" || view.PausedUntil == nil {
		t.Errorf("during the wait: shaper_lane_paused %v, /v1/lanes state %q paused_until %v; want 1, paused, set", paused, view.State, view.PausedUntil)
	}
}
