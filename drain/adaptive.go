package drain

import (
	"context"
	"errors"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// laneAdaptive is the adaptive rate of a lane (rate.adaptive, SPEC §3
// Adaptive rate; the rule is shaper.Adaptive). Guarded by the lane's mutex.
type laneAdaptive struct {
	a       *shaper.Adaptive // nil = off
	applied float64          // the rate last given to the pacer, messages per second
}

// adaptiveApplyShare is the least relative change of the adaptive rate that
// is given to the pacer (decreases, and reaching min or limit, always are):
// the additive increase moves the rate on every success, and a change of
// the pacer's rate forgives the lateness being made up under a backlog
// (Pacer.SetConfig), which at every departure would cost rate.
const adaptiveApplyShare = 0.01

func adaptiveConfig(cfg config.Lane) shaper.AdaptiveConfig {
	return shaper.AdaptiveConfig{
		Min:      shaper.Limit(cfg.Rate.Adaptive.Min),
		Max:      cfg.Rate.Limit,
		Cooldown: cfg.Rate.Adaptive.Cooldown,
	}
}

// setAdaptive turns the adaptive rate on, off or re-bounds it for cfg (New,
// Update), with l.mu held; the rate reached is kept, clamped (a reload is
// not a reset).
func (l *Lane) setAdaptive(cfg config.Lane) {
	switch {
	case !cfg.Rate.Adaptive.Min.On():
		l.adapt.a = nil
	case l.adapt.a == nil:
		l.adapt.a = shaper.NewAdaptive(adaptiveConfig(cfg))
	default:
		l.adapt.a.SetConfig(adaptiveConfig(cfg))
	}
}

// limitNow returns the pacer's limit at now: rate.limit, or the adaptive
// rate in force when it is on. Call with l.mu held.
func (l *Lane) limitNow(cfg config.Lane, now time.Time) shaper.Limit {
	if l.adapt.a == nil {
		return cfg.Rate.Limit
	}
	l.adapt.applied = l.adapt.a.Rate(now)
	return shaper.Limit(l.adapt.applied)
}

// adaptRecord feeds the answer of one attempt to the adaptive rate: a
// success raises it, a 429 or 503 lowers it (shaper.Adaptive); other
// failures say nothing about the pace.
func (l *Lane) adaptRecord(err error, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.adapt.a
	if a == nil {
		return
	}
	var se *shaper.SinkError
	switch {
	case err == nil:
		a.Success(now)
	case errors.As(err, &se) && se.Saturated: // 429 or 503
		if a.Saturated(now) {
			l.log.Info("adaptive rate lowered", "status", se.Status, "rate", shaper.Limit(a.Rate(now)).String())
		}
	default:
		return
	}
	l.applyAdaptive(now)
}

// applyAdaptive gives the adaptive rate in force to the pacer when it moved
// enough (adaptiveApplyShare), through Pacer.SetConfig, which keeps the
// schedule in departures: no credit, and the next gap is the new interval
// (SPEC G1, G2 at the rate in force). Call with l.mu held.
func (l *Lane) applyAdaptive(now time.Time) {
	a := l.adapt.a
	r := a.Rate(now)
	cfg := l.conf()
	edge := r == float64(cfg.Rate.Limit) || r == float64(cfg.Rate.Adaptive.Min)
	if r == l.adapt.applied || (r > l.adapt.applied && r < l.adapt.applied*(1+adaptiveApplyShare) && !edge) {
		return
	}
	pc := pacerConfig(*cfg)
	pc.Limit = l.limitNow(*cfg, now)
	l.pacer.SetConfig(pc, now)
	l.m.RateLimit.Set(l.pacer.Rate(now))
	// No wake: the departure loop re-reads Next after its wait, so a
	// decrease holds from the departure being waited for.
}

// withRateLimitReport makes the sink report the rate-limit headers of its
// answers to the adaptive rate, when rate.adaptive.headers is on.
func (l *Lane) withRateLimitReport(ctx context.Context) context.Context {
	cfg := l.conf()
	if !cfg.Rate.Adaptive.Min.On() || !cfg.Rate.Adaptive.Headers {
		return ctx
	}
	return shaper.WithRateLimitReport(ctx, l.rateLimitHeaders)
}

// rateLimitHeaders applies what one answer said about the downstream's
// budget: a ceiling on the rate, or, when it is spent, a pause of the lane
// until its reset (like Retry-After, capped at task.retry.max_delay).
func (l *Lane) rateLimitHeaders(h shaper.RateLimitInfo) {
	now := time.Now()
	l.mu.Lock()
	var until time.Time
	if l.adapt.a != nil {
		until = l.adapt.a.Headers(now, h)
		l.applyAdaptive(now)
	}
	l.mu.Unlock()
	if until.IsZero() {
		return
	}
	if d := l.conf().Task.Retry.MaxDelay; d > 0 && until.Sub(now) > d {
		until = now.Add(d)
	}
	l.Pause(until)
}
