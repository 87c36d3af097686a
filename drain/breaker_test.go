package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// The breaker of SPEC §3 in the worker, on the fake clock: the gate, the
// probes, the close through the warmup ramp, the 410 hold, the reset and the
// reload. The rule itself is tested on instants in shaper/breaker_test.go.

// TestAttemptOf: how each end of an attempt counts for the breaker.
func TestAttemptOf(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		timedOut bool
		want     shaper.Attempt
	}{
		{"delivered", nil, false, shaper.AttemptSuccess},
		{"task timeout", &shaper.SinkError{Err: context.DeadlineExceeded}, true, shaper.AttemptFailure},
		{"network error", &shaper.SinkError{Err: errors.New("connection refused")}, false, shaper.AttemptFailure},
		{"a plain error (nats sink)", errors.New("nats: timeout"), false, shaper.AttemptFailure},
		{"500", &shaper.SinkError{Status: 500}, false, shaper.AttemptFailure},
		{"503 with Retry-After", &shaper.SinkError{Status: 503, RetryAfter: time.Second, Saturated: true}, false, shaper.AttemptFailure},
		{"599", fmt.Errorf("wrapped: %w", &shaper.SinkError{Status: 599}), false, shaper.AttemptFailure},
		{"410 Gone", &shaper.SinkError{Status: 410, Permanent: true}, false, shaper.AttemptGone},
		{"410 wrapped", fmt.Errorf("lane: %w", &shaper.SinkError{Status: 410, Permanent: true}), false, shaper.AttemptGone},
		{"400", &shaper.SinkError{Status: 400, Permanent: true}, false, shaper.AttemptNeutral},
		{"404", &shaper.SinkError{Status: 404, Permanent: true}, false, shaper.AttemptNeutral},
		{"408", &shaper.SinkError{Status: 408}, false, shaper.AttemptNeutral},
		{"429", &shaper.SinkError{Status: 429, RetryAfter: time.Second, Saturated: true}, false, shaper.AttemptNeutral},
		{"409 listed as retryable", &shaper.SinkError{Status: 409}, false, shaper.AttemptNeutral},
		{"permanent with no status (bad key)", &shaper.SinkError{Permanent: true}, false, shaper.AttemptNeutral},
		{"invalid message (sink.url's header missing): the request never left",
			&shaper.SinkError{Permanent: true, Err: fmt.Errorf("url: %w", shaper.ErrInvalidMessage)}, false, shaper.AttemptNeutral},
	} {
		if got := attemptOf(tc.err, tc.timedOut); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func breakerLane(limit float64) config.Lane {
	cfg := laneConfig(limit)
	cfg.Task.MaxInFlight = 2
	cfg.Task.Timeout = time.Second
	cfg.Source.AckWait = 4 * time.Second // shorter than the open spell: in-progress acks must keep them
	cfg.Task.Retry.Backoff = []time.Duration{100 * time.Millisecond}
	cfg.Rate.Warmup = config.Warmup{Period: 2 * time.Second, ColdFactor: 4}
	cfg.Task.Breaker = config.Breaker{FailureRatio: 0.5, MinAttempts: 5, Window: 10 * time.Second, ProbeEvery: time.Second}
	return cfg
}

func newBreakerHarness(t *testing.T, cfg config.Lane, sink *recSink) (*harness, *logRecorder) {
	t.Helper()
	rec := &logRecorder{}
	h := &harness{t: t, src: sourcetest.NewMem(cfg.Source.AckWait), sink: sink, dead: &recSink{}, reg: prometheus.NewRegistry()}
	h.m = metrics.New(h.reg).Lane("test", float64(cfg.Rate.Limit))
	l, err := New("test", cfg, h.src, sink, WithWaiter(TimerWaiter{}), WithMetrics(h.m), WithDeadLetter(h.dead),
		WithLogger(slog.New(rec)))
	if err != nil {
		t.Fatal(err)
	}
	h.lane = l
	return h, rec
}

// TestLaneBreakerOpensProbesCloses: a downstream down for its first 6 s
// under a backlog. The breaker opens after the 5th failure; then one probe
// leaves every second, and nothing else; held messages are neither nak'd
// nor redelivered by ack wait (in-progress acks); the first probe after the
// recovery closes it, and the lane resumes cold, through the warmup ramp,
// with no burst; everything is delivered with no dead letter.
func TestLaneBreakerOpensProbesCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		down := 6 * time.Second
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			if c.at.Sub(start) < down {
				return time.Millisecond, &shaper.SinkError{Status: 503, Err: errors.New("service unavailable")}
			}
			return time.Millisecond, nil
		}}
		h, logs := newBreakerHarness(t, breakerLane(100), sink)
		h.src.Publish(300)
		h.lane.Start()
		time.Sleep(3 * time.Second)
		if open, held := h.lane.BreakerOpen(); !open || held {
			t.Errorf("at 3 s: open %v held %v, want open, not held", open, held)
		}
		if g := testutil.ToFloat64(h.m.BreakerOpen); g != 1 {
			t.Errorf("shaper_breaker_open %v while open, want 1", g)
		}
		time.Sleep(12 * time.Second)
		synctest.Wait()
		h.stop(time.Second)

		cs := sink.snapshot()
		var failed, ok []time.Time
		for _, c := range cs {
			if c.at.Sub(start) < down {
				failed = append(failed, c.at)
			} else {
				ok = append(ok, c.at)
			}
		}
		// 5 failures open it (each ends 1 ms after it left, well before the
		// next departure), then probes at +1 s, +2 s, … while down.
		if len(failed) < 6 {
			t.Fatalf("%d failed calls, want 5 and probes", len(failed))
		}
		opened := failed[4].Add(time.Millisecond)
		probes := failed[5:]
		for i, p := range probes {
			want := opened.Add(time.Duration(i+1) * time.Second)
			if d := p.Sub(want); d < 0 || d > time.Millisecond {
				t.Errorf("probe %d at %v after the opening, want %v (one every probe_every)", i+1, p.Sub(opened), want.Sub(opened))
			}
		}
		// The first call after the recovery is a probe, a second after the last.
		first := ok[0]
		if d := first.Sub(opened.Add(time.Duration(len(probes)+1) * time.Second)); d < 0 || d > time.Millisecond {
			t.Errorf("first success %v after the opening, want the probe at %v", first.Sub(opened), time.Duration(len(probes)+1)*time.Second)
		}
		// Closed: through the ramp from cold (open > period, so fully cold):
		// 25/s rising to 100/s over 2 s, no burst.
		if g := ok[1].Sub(ok[0]); g < 40*time.Millisecond {
			t.Errorf("first gap after the close %v, want the cold interval 40 ms", g)
		}
		for i, c := range ok {
			x := c.Sub(first).Seconds()
			if bound := rampIntegralDrain(100, 4, 2, x) + 1 + 1e-9; float64(i) > bound {
				t.Fatalf("departure %d, %.3f s after the closing probe, exceeds the ramp's integral + 1 (%.1f)", i, x, bound)
			}
		}
		if n := len(ok); n != 300 {
			t.Errorf("%d delivered, want all 300", n)
		}
		if n := len(h.dead.snapshot()); n != 0 {
			t.Errorf("%d dead letters, want 0", n)
		}
		// Nothing held was nak'd or redelivered by ack wait while open: the
		// only retries are the failed calls.
		if n := testutil.ToFloat64(h.m.Retries[shaper.OutcomeError]); int(n) != len(failed) {
			t.Errorf("%v retries, want %d (one per failed call, nothing else nak'd)", n, len(failed))
		}
		if h.src.Redelivered() != 0 {
			t.Errorf("%d redeliveries by ack wait, want 0 (in-progress acks while open)", h.src.Redelivered())
		}
		if g := testutil.ToFloat64(h.m.BreakerOpen); g != 0 {
			t.Errorf("shaper_breaker_open %v after the close, want 0", g)
		}
		if o, c := logs.count(slog.LevelWarn, "breaker opened"), logs.count(slog.LevelInfo, "breaker closed"); o != 1 || c != 1 {
			t.Errorf("logged open %d and close %d times, want once each", o, c)
		}
	})
}

func rampIntegralDrain(limit, cf, period, x float64) float64 {
	c := 1 / cf
	if x <= period {
		return limit * (c*x + (1-c)*x*x/(2*period))
	}
	return rampIntegralDrain(limit, cf, period, period) + limit*(x-period)
}

// TestLaneBreakerOneProbeInFlight: a probe that hangs until the task
// timeout holds the next one back: never two probes in flight, so probes
// leave a timeout apart, not probe_every apart.
func TestLaneBreakerOneProbeInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			return time.Minute, nil // hangs until the task timeout ends it
		}}
		cfg := breakerLane(100)
		cfg.Task.Timeout = 2 * time.Second
		cfg.Task.MaxInFlight = 8
		cfg.Source.MaxDeliver = -1
		h, _ := newBreakerHarness(t, cfg, sink)
		h.src.Publish(50)
		h.lane.Start()
		time.Sleep(20 * time.Second)
		synctest.Wait()
		h.stop(3 * time.Second)
		cs := sink.snapshot()
		// The first 8 leave at the cold rate and time out from 2 s on; as
		// their slots free, a few more leave until the 5th timeout opens
		// the breaker (~2.2 s). From 3 s on, only probes leave.
		var after []time.Time
		for _, c := range cs {
			if c.at.Sub(cs[0].at) > 3*time.Second {
				after = append(after, c.at)
			}
		}
		if len(after) < 3 {
			t.Fatalf("%d probes in 17 s, want some", len(after))
		}
		for i := 1; i < len(after); i++ {
			if g := after[i].Sub(after[i-1]); g < 2*time.Second {
				t.Errorf("probes %d and %d %v apart: a probe left while one was in flight (timeout 2 s)", i-1, i, g)
			}
		}
	})
}

// TestLaneBreakerGoneHoldsUntilReset: one 410 holds the lane with no probes
// (SPEC §3 Breaker); the 410'd message is dead-lettered rejected_by_sink;
// ResetBreaker resumes it through the warmup ramp.
func TestLaneBreakerGoneHoldsUntilReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := true
		var mu sync.Mutex
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			mu.Lock()
			defer mu.Unlock()
			if first {
				first = false
				return time.Millisecond, &shaper.SinkError{Status: 410, Permanent: true, Err: errors.New("gone")}
			}
			return time.Millisecond, nil
		}}
		h, logs := newBreakerHarness(t, breakerLane(50), sink)
		h.src.Publish(100)
		h.lane.Start()
		time.Sleep(30 * time.Second)
		if n := len(sink.snapshot()); n != 1 {
			t.Errorf("%d calls in 30 s after a 410, want 1 (held, no probes)", n)
		}
		if open, held := h.lane.BreakerOpen(); !open || !held {
			t.Errorf("open %v held %v after a 410, want held", open, held)
		}
		if g := testutil.ToFloat64(h.m.BreakerOpen); g != 1 {
			t.Errorf("shaper_breaker_open %v while held, want 1", g)
		}
		if g := testutil.ToFloat64(h.m.RateLimit); g != 0 {
			t.Errorf("shaper_rate_limit_per_second %v while held, want 0", g)
		}
		if logs.count(slog.LevelError, "breaker held open: the downstream answered 410 Gone; departures wait for an operator's resume") != 1 {
			t.Error("the hold is not logged once with the operator's resume")
		}
		reset := time.Now()
		if !h.lane.ResetBreaker() {
			t.Error("ResetBreaker reported a closed breaker")
		}
		if h.lane.ResetBreaker() {
			t.Error("a second ResetBreaker reported a change")
		}
		time.Sleep(2500 * time.Millisecond) // warm from 2 s on; 99 take ~2.7 s
		if g := testutil.ToFloat64(h.m.RateLimit); g != 50 {
			t.Errorf("shaper_rate_limit_per_second %v 2.5 s after the reset, want 50 (warm again)", g)
		}
		time.Sleep(8 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()[1:]
		if len(cs) != 99 {
			t.Fatalf("%d delivered after the reset, want 99", len(cs))
		}
		// Cold after 30 s held (period 2 s): 12.5/s rising to 50/s.
		if g := cs[1].at.Sub(cs[0].at); g < 80*time.Millisecond {
			t.Errorf("first gap after the reset %v, want the cold interval 80 ms", g)
		}
		for i, c := range cs {
			x := c.at.Sub(reset).Seconds()
			if bound := rampIntegralDrain(50, 4, 2, x) + 1 + 1e-9; float64(i+1) > bound {
				t.Fatalf("departure %d at %.3f s after the reset exceeds the ramp's integral + 1 (%.1f)", i+1, x, bound)
			}
		}
		dl := h.dead.snapshot()
		if len(dl) != 1 || dl[0].header[HeaderReason][0] != shaper.ReasonRejectedBySink {
			t.Errorf("dead letters %v, want the 410'd message, rejected_by_sink", dl)
		}
		if g := testutil.ToFloat64(h.m.BreakerOpen); g != 0 {
			t.Errorf("shaper_breaker_open %v after the reset, want 0", g)
		}
		if logs.count(slog.LevelInfo, "breaker closed by an operator's resume") != 1 {
			t.Error("the reset is not logged once")
		}
	})
}

// TestLaneBreakerReload: task.breaker applies in place; failure_ratio 0
// turns an open breaker off and the lane resumes; a breaker turned on by a
// reload opens.
func TestLaneBreakerReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			return time.Millisecond, &shaper.SinkError{Status: 500}
		}}
		cfg := breakerLane(20)
		cfg.Source.MaxDeliver = -1
		cfg.Task.Breaker.FailureRatio = 0 // off at start
		h, _ := newBreakerHarness(t, cfg, sink)
		h.src.Publish(100)
		h.lane.Start()
		time.Sleep(2 * time.Second)
		if open, _ := h.lane.BreakerOpen(); open {
			t.Fatal("open while off")
		}
		on := cfg
		on.Task.Breaker.FailureRatio = 1
		if err := h.lane.Update(on); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if open, _ := h.lane.BreakerOpen(); !open {
			t.Fatal("not open 2 s after a reload turned it on against a failing downstream")
		}
		before := len(sink.snapshot())
		time.Sleep(3 * time.Second)
		if n := len(sink.snapshot()) - before; n > 3 {
			t.Errorf("%d calls in 3 s open with probe_every 1s, want ≤ 3", n)
		}
		if err := h.lane.Update(cfg); err != nil { // off again
			t.Fatal(err)
		}
		if open, _ := h.lane.BreakerOpen(); open {
			t.Error("still open after a reload turned it off")
		}
		before = len(sink.snapshot())
		time.Sleep(2 * time.Second)
		if n := len(sink.snapshot()) - before; n < 10 {
			t.Errorf("%d calls in 2 s after the breaker was turned off, want the lane departing again", n)
		}
		synctest.Wait()
		h.stop(time.Second)
	})
}

// TestLaneBreakerProbesPreciseWaiter: in real time with the precise waiter,
// whose watcher goroutine owns the tokens of the lane's wake channel, each
// probe's end still wakes the gate: probes keep leaving every probe_every
// until one succeeds (the gate once read the channel itself, lost the wake
// of the first probe's end and stayed open with no probes).
func TestLaneBreakerProbesPreciseWaiter(t *testing.T) {
	start := time.Now()
	down := 1500 * time.Millisecond
	sink := &recSink{behave: func(c call) (time.Duration, error) {
		if c.at.Sub(start) < down {
			return time.Millisecond, &shaper.SinkError{Status: 503}
		}
		return 0, nil
	}}
	cfg := breakerLane(100)
	cfg.Rate.Warmup = config.Warmup{ColdFactor: 1}
	cfg.Task.Breaker.ProbeEvery = 150 * time.Millisecond
	h := &harness{t: t, src: sourcetest.NewMem(cfg.Source.AckWait), sink: sink, dead: &recSink{}, reg: prometheus.NewRegistry()}
	h.m = metrics.New(h.reg).Lane("test", 100)
	l, err := New("test", cfg, h.src, sink, WithWaiter(NewPreciseWaiter()), WithMetrics(h.m), WithDeadLetter(h.dead))
	if err != nil {
		t.Fatal(err)
	}
	h.lane = l
	h.src.Publish(100)
	l.Start()
	deadline := time.Now().Add(5 * time.Second)
	for h.src.Count("acked") < 100 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	h.stop(time.Second)
	var probes int
	cs := sink.snapshot()
	for i := 5; i < len(cs) && cs[i].at.Sub(start) < down; i++ {
		probes++
	}
	t.Logf("%d probes in %v down with probe_every %v", probes, down, cfg.Task.Breaker.ProbeEvery)
	if probes < 6 {
		t.Errorf("%d probes while down, want about %d", probes, int(down/cfg.Task.Breaker.ProbeEvery)-1)
	}
	if n := h.src.Count("acked"); n != 100 {
		t.Errorf("%d acked, want 100: the breaker never closed", n)
	}
}
