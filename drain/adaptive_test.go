package drain

import (
	"context"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// wallSink is a downstream that accepts up to rate calls per second (a token
// bucket of burst 2 of its own) and answers 429 above, without Retry-After.
type wallSink struct {
	rec    *recSink
	mu     sync.Mutex
	rate   float64
	tokens float64
	at     time.Time
	status map[time.Time]bool // call instant → accepted
	header func(n int) *shaper.RateLimitInfo
	n      int
}

func (s *wallSink) Send(ctx context.Context, m *shaper.Message) error {
	_ = s.rec.Send(ctx, m)
	now := time.Now()
	s.mu.Lock()
	if s.at.IsZero() {
		s.tokens, s.at = 2, now
	}
	s.tokens = math.Min(2, s.tokens+now.Sub(s.at).Seconds()*s.rate)
	s.at = now
	ok := s.tokens >= 1
	if ok {
		s.tokens--
	}
	s.status[now] = ok
	s.n++
	var h *shaper.RateLimitInfo
	if s.header != nil {
		h = s.header(s.n)
	}
	s.mu.Unlock()
	if report := shaper.RateLimitReportFrom(ctx); report != nil && h != nil {
		report(*h)
	}
	time.Sleep(2 * time.Millisecond) // the answer's latency
	if !ok {
		return &shaper.SinkError{Status: 429, Saturated: true}
	}
	return nil
}

func adaptiveLane(limit, min float64) config.Lane {
	cfg := laneConfig(limit)
	cfg.Rate.Adaptive = config.Adaptive{Min: config.OptionalLimit(min), Cooldown: 5 * time.Second, Headers: true}
	cfg.Bucket.Capacity = 200
	cfg.Source.MaxDeliver = -1
	cfg.Task.Retry.Backoff = []time.Duration{time.Second}
	return cfg
}

// TestLaneAdaptiveFindsTheWall: SPEC §3 Adaptive rate — a lane at 100/s,
// min 10/s, before a downstream that accepts 60/s and answers 429 above:
// from 20 s on the accepted rate is within 52–60/s and fewer than 2 % of the
// calls get a 429; the rate in force shows in Status and
// shaper_rate_limit_per_second; and at every change G1 holds at the rate in
// force: no gap below min_spacing intervals of the rate in force before it.
func TestLaneAdaptiveFindsTheWall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &wallSink{rec: &recSink{}, rate: 60, status: map[time.Time]bool{}}
		cfg := adaptiveLane(100, 10)
		h := newHarness(t, cfg, sink.rec)
		h.lane.SetSink(sink)
		h.src.Publish(5000)
		start := time.Now()
		h.lane.Start()
		rates := []float64{100} // the rate in force at each 100 ms
		for range 600 {
			time.Sleep(100 * time.Millisecond)
			rates = append(rates, h.lane.Status(time.Now()).Rate)
		}
		synctest.Wait()
		metric := testutil.ToFloat64(h.m.RateLimit)
		status := h.lane.Status(time.Now()).Rate
		h.stop(time.Second)
		cs := sink.rec.snapshot()
		var calls, rejected, accepted int
		for _, c := range cs {
			if c.at.Sub(start) < 20*time.Second {
				continue
			}
			calls++
			if sink.status[c.at] {
				accepted++
			} else {
				rejected++
			}
		}
		rate := float64(accepted) / 40
		t.Logf("from 20 s to 60 s: %d calls, %.2f/s accepted, %d 429 (%.2f %%); rate in force now %.2f/s", calls, rate, rejected, 100*float64(rejected)/float64(calls), status)
		if rate < 52 || rate > 60 {
			t.Errorf("accepted %.2f/s after 20 s, want within 52–60/s", rate)
		}
		if share := float64(rejected) / float64(calls); share >= 0.02 {
			t.Errorf("%.2f %% of calls got a 429 after 20 s, want < 2 %%", 100*share)
		}
		if status < 50 || status > 66 || math.Abs(metric-status) > 1e-9 {
			t.Errorf("rate in force: Status %.2f/s, shaper_rate_limit_per_second %.2f/s, want equal and near 60/s", status, metric)
		}
		for _, r := range rates {
			if r > 100 || r < 10 {
				t.Fatalf("rate in force %.2f/s outside [min 10, limit 100]", r)
			}
		}
		// G1 at the rate in force: each gap ≥ 0.95 interval of the rate
		// in force at the previous departure (sampled each 100 ms: the
		// highest rate of the samples around it is the loosest bound).
		for i := 1; i < len(cs); i++ {
			k := int(cs[i-1].at.Sub(start) / (100 * time.Millisecond))
			hi := 0.0
			for j := max(0, k-1); j <= min(len(rates)-1, k+1); j++ {
				hi = math.Max(hi, rates[j])
			}
			if gap := cs[i].at.Sub(cs[i-1].at); hi > 0 && gap < time.Duration(0.95*float64(time.Second)/hi)-time.Microsecond {
				t.Fatalf("gap %d = %v at %v, under 0.95 interval of the rate in force %.2f/s", i, gap, cs[i].at.Sub(start), hi)
			}
		}
		if n := maxInWindow(times(cs), time.Second); n > 101 {
			t.Errorf("%d departures in a 1 s window, above limit + 1", n)
		}
	})
}

// TestLaneAdaptiveSpentBudgetPauses: a downstream that answers call 5 with
// RateLimit-Remaining: 0 and a reset of 3 s gets no call until the reset,
// then calls resume at the rate with no burst (G2).
func TestLaneAdaptiveSpentBudgetPauses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &wallSink{rec: &recSink{}, rate: 1000, status: map[time.Time]bool{},
			header: func(n int) *shaper.RateLimitInfo {
				if n == 5 {
					return &shaper.RateLimitInfo{Limit: 100, Remaining: 0, Reset: 3 * time.Second}
				}
				return nil
			}}
		h := newHarness(t, adaptiveLane(20, 1), sink.rec)
		h.lane.SetSink(sink)
		h.src.Publish(40)
		h.lane.Start()
		time.Sleep(1500 * time.Millisecond)
		paused := testutil.ToFloat64(h.m.Paused)
		time.Sleep(8 * time.Second)
		h.stop(time.Second)
		cs := sink.rec.snapshot()
		if len(cs) < 10 {
			t.Fatalf("%d calls", len(cs))
		}
		reset := cs[4].at.Add(3 * time.Second)
		if g := cs[5].at.Sub(cs[4].at); g < 3*time.Second {
			t.Errorf("call 6 came %v after the answer that spent the budget, want ≥ 3s (the reset)", g)
		}
		if cs[5].at.Sub(reset) > 60*time.Millisecond {
			t.Errorf("call 6 came %v after the reset, want at it", cs[5].at.Sub(reset))
		}
		if g := cs[6].at.Sub(cs[5].at); g < 47*time.Millisecond {
			t.Errorf("gap after the pause %v, want one interval (50ms): no burst", g)
		}
		if paused != 1 {
			t.Errorf("shaper_lane_paused %v during the wait for the reset, want 1", paused)
		}
	})
}

// TestLaneAdaptiveHeadersOff: with rate.adaptive.headers false the spent
// budget is not followed (the 429s still are).
func TestLaneAdaptiveHeadersOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &wallSink{rec: &recSink{}, rate: 1000, status: map[time.Time]bool{},
			header: func(n int) *shaper.RateLimitInfo {
				return &shaper.RateLimitInfo{Limit: 100, Remaining: 0, Reset: 3 * time.Second}
			}}
		cfg := adaptiveLane(20, 1)
		cfg.Rate.Adaptive.Headers = false
		h := newHarness(t, cfg, sink.rec)
		h.lane.SetSink(sink)
		h.src.Publish(60)
		h.lane.Start()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if n := len(sink.rec.snapshot()); n < 30 {
			t.Errorf("%d calls in 2 s at 20/s with headers off, want ~40", n)
		}
	})
}

// TestLaneAdaptiveReloadKeepsRate: a reload keeps the rate reached (clamped
// to the new bounds); turning adaptive off restores the limit.
func TestLaneAdaptiveReloadKeepsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &wallSink{rec: &recSink{}, rate: 30, status: map[time.Time]bool{}}
		cfg := adaptiveLane(100, 10)
		h := newHarness(t, cfg, sink.rec)
		h.lane.SetSink(sink)
		h.src.Publish(3000)
		h.lane.Start()
		time.Sleep(15 * time.Second)
		before := h.lane.Status(time.Now()).Rate
		cfg.Task.Timeout = 4 * time.Second
		if err := h.lane.Update(cfg); err != nil {
			t.Fatal(err)
		}
		after := h.lane.Status(time.Now()).Rate
		if before > 60 || math.Abs(after-before) > before*adaptiveApplyShare {
			t.Errorf("rate before reload %.2f/s, after %.2f/s: want it kept, and lowered from 100/s", before, after)
		}
		cfg.Rate.Adaptive.Min = 0
		if err := h.lane.Update(cfg); err != nil {
			t.Fatal(err)
		}
		if got := h.lane.Status(time.Now()).Rate; got != 100 {
			t.Errorf("rate after adaptive off %.2f/s, want the limit 100/s", got)
		}
		h.stop(time.Millisecond)
	})
}

// TestLaneAdaptiveOnlySaturationLowers: a 500 or a timeout says nothing
// about the pace: the rate stays at the limit; a 503 lowers it.
func TestLaneAdaptiveOnlySaturationLowers(t *testing.T) {
	for _, tc := range []struct {
		status int
		lowers bool
	}{{500, false}, {502, false}, {503, true}} {
		synctest.Test(t, func(t *testing.T) {
			sink := &recSink{behave: func(call) (time.Duration, error) {
				return 0, &shaper.SinkError{Status: tc.status, Saturated: tc.status == 503}
			}}
			h := newHarness(t, adaptiveLane(50, 5), sink)
			h.src.Publish(100)
			h.lane.Start()
			time.Sleep(2 * time.Second)
			rate := h.lane.Status(time.Now()).Rate
			h.stop(time.Millisecond)
			if lowered := rate < 50; lowered != tc.lowers {
				t.Errorf("status %d: rate %.2f/s after 2 s of it, want lowered %v", tc.status, rate, tc.lowers)
			}
		})
	}
}
