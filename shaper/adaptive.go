package shaper

import (
	"context"
	"math"
	"time"
)

// Adaptive is the adaptive rate of one lane (SPEC §3 Adaptive rate,
// rate.adaptive): an AIMD controller of the lane's rate between Min and Max
// (the configured limit), fed with what the downstream answers.
//
//   - Decrease. A saturated answer (429 or 503) lowers the rate to
//     min(DecreaseFactor × rate, max(accepted, rate / 2)), at most once per
//     Cooldown, where accepted is the rate of successful calls since the
//     previous decrease. The factor alone keeps the sawtooth narrow once the
//     rate is near the downstream's (a rate that oscillates between 0.9 and
//     1.0 of it delivers ~95 % of it); the accepted rate lets the first
//     decreases reach the downstream's rate in one or two cooldowns instead
//     of log(limit/true)/log(1/0.9) of them; the halving bounds the fall
//     when the accepted rate is low for want of work rather than refusals.
//   - Increase. Each successful call adds step / rate, so that calls
//     succeeding at the rate in force raise it by step per second (additive:
//     the step does not depend on the rate in force). The step is
//     (1 − DecreaseFactor) × top / (ClimbCooldowns × Cooldown), where top is
//     the rate before the last decrease (Max at first): the climb back to
//     the rate that was refused takes ClimbCooldowns cooldowns, so the next
//     refusal finds the cooldown over and lowers the rate at once instead of
//     letting it rise further above the downstream's (with a step of 1 % of
//     Max per second, a wall at a third of Max was crossed within the
//     cooldown and 4–10 % of calls got a 429). Above top the rate probes
//     new ground and top follows it. Idle time earns nothing: only calls count.
//   - Headers (when Headers is true, see RateLimitInfo). A remaining
//     budget of 0 with a reset holds every call until the reset (PauseUntil,
//     like a Retry-After pause); a remaining budget R with a reset in T caps
//     the rate at R / T until the reset, the rate that spends the budget
//     evenly; a limit L per window W (RateLimit-Policy or a w= parameter)
//     caps it at L / W while the header keeps saying so.
//
// The rate never leaves [Min, Max]. The caller applies Rate to the pacer with
// Pacer.SetConfig, which keeps the schedule in departures, so a change earns
// no credit (SPEC G2) and the next gap is the new interval (G1 at the rate in
// force).
//
// An Adaptive is not safe for concurrent use; every method is a pure
// function of the instants passed in.
type Adaptive struct {
	cfg  AdaptiveConfig
	rate float64 // AIMD rate, messages per second, in [Min, Max]

	top         float64   // rate before the last decrease (Max at first)
	decreasedAt time.Time // last decrease; zero = none yet
	since       time.Time // start of the accepted-rate window; zero = no call yet
	accepted    int       // successful calls since `since`

	ceiling      float64   // from the headers, messages per second; 0 = none
	ceilingUntil time.Time // the ceiling holds before this instant
	pauseUntil   time.Time // no call before this instant (Remaining 0)
}

// AdaptiveConfig bounds and paces an Adaptive.
type AdaptiveConfig struct {
	// Min is the lowest rate, in messages per second (rate.adaptive.min); > 0.
	Min Limit
	// Max is the highest rate, in messages per second: the lane's rate.limit.
	Max Limit
	// Cooldown is the least time between two decreases
	// (rate.adaptive.cooldown); 0 means DefaultAdaptiveCooldown.
	Cooldown time.Duration
}

// DecreaseFactor multiplies the rate on a saturated answer (429/503): 0.9.
// TCP halves its window because it shares a link with other flows and must
// give room fast; a lane is alone before a rigid downstream whose limit is a
// wall, so a narrow sawtooth (0.9–1.0 of the wall, ~95 % delivered) is worth
// more than a fast retreat, which the accepted rate provides anyway.
const DecreaseFactor = 0.9

// ClimbCooldowns is how many cooldowns the additive increase takes to climb
// from DecreaseFactor × top back to top: 2. One would let the rate reach the
// wall just as the cooldown ends, with no room for the answers in flight;
// two keep each cycle to one decrease and a few 429s (SPEC §3 proof: fewer
// than 2 %), and the sawtooth spends most of its time near the top.
const ClimbCooldowns = 2

// DefaultAdaptiveCooldown is the default of rate.adaptive.cooldown: the
// answers to the calls that left at the old rate arrive within it, and they
// must not lower the rate again.
const DefaultAdaptiveCooldown = 5 * time.Second

// NewAdaptive returns an adaptive rate for cfg, starting at Max: the
// configured limit is the operator's best knowledge until the downstream
// says otherwise.
func NewAdaptive(cfg AdaptiveConfig) *Adaptive {
	a := &Adaptive{}
	a.SetConfig(cfg)
	a.rate = float64(a.cfg.Max)
	a.top = a.rate
	return a
}

// SetConfig changes the bounds and the cooldown (hot reload), keeping the
// rate reached, clamped to the new bounds.
func (a *Adaptive) SetConfig(cfg AdaptiveConfig) {
	if !(cfg.Max > 0) || math.IsInf(float64(cfg.Max), 0) {
		cfg.Max = 1
	}
	if !(cfg.Min > 0) || cfg.Min > cfg.Max {
		cfg.Min = cfg.Max
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = DefaultAdaptiveCooldown
	}
	a.cfg = cfg
	a.rate = a.clamp(a.rate)
	a.top = a.clamp(a.top)
}

func (a *Adaptive) clamp(r float64) float64 {
	return math.Max(float64(a.cfg.Min), math.Min(float64(a.cfg.Max), r))
}

// Rate returns the rate in force at now, in messages per second: the AIMD
// rate under the headers' ceiling, within [Min, Max].
func (a *Adaptive) Rate(now time.Time) float64 {
	r := a.rate
	if a.ceiling > 0 && now.Before(a.ceilingUntil) {
		r = math.Min(r, a.ceiling)
	}
	return a.clamp(r)
}

// PauseUntil returns the instant before which no call may leave because the
// downstream said its budget is spent (RateLimit-Remaining: 0), or the zero
// time.
func (a *Adaptive) PauseUntil() time.Time { return a.pauseUntil }

// Success records a call that the downstream accepted at now.
func (a *Adaptive) Success(now time.Time) {
	if a.since.IsZero() {
		a.since = now
	}
	a.accepted++
	a.rate = a.clamp(a.rate + a.step()/a.rate)
	a.top = math.Max(a.top, a.rate)
}

// step is the additive increase, in messages per second per second of
// successful calls.
func (a *Adaptive) step() float64 {
	return (1 - DecreaseFactor) * a.top / (ClimbCooldowns * a.cfg.Cooldown.Seconds())
}

// Saturated records a 429 or 503 answered at now and reports whether it
// lowered the rate (false within Cooldown of the previous decrease).
func (a *Adaptive) Saturated(now time.Time) bool {
	if !a.decreasedAt.IsZero() && now.Sub(a.decreasedAt) < a.cfg.Cooldown {
		return false
	}
	next := DecreaseFactor * a.rate
	if !a.since.IsZero() {
		if span := now.Sub(a.since).Seconds(); span > 0 {
			accepted := float64(a.accepted) / span
			next = math.Min(next, math.Max(accepted, a.rate/2))
		}
	}
	a.top = a.rate
	a.rate = a.clamp(next)
	a.decreasedAt, a.since, a.accepted = now, now, 0
	return true
}

// Headers records the rate-limit headers of an answer received at now
// (success or not) and returns the instant until which no call may leave,
// or the zero time when the budget is not spent.
func (a *Adaptive) Headers(now time.Time, h RateLimitInfo) time.Time {
	if h.Remaining == 0 && h.Reset > 0 {
		until := now.Add(h.Reset)
		if until.After(a.pauseUntil) {
			a.pauseUntil = until
		}
		return until
	}
	switch {
	case h.Remaining > 0 && h.Reset > 0:
		a.ceiling = float64(h.Remaining) / h.Reset.Seconds()
		a.ceilingUntil = now.Add(h.Reset)
	case h.Limit > 0 && h.Window > 0:
		a.ceiling = float64(h.Limit) / h.Window.Seconds()
		a.ceilingUntil = now.Add(h.Window)
	}
	return time.Time{}
}

// RateLimitInfo is what a response said about the downstream's budget, in
// the IETF draft's RateLimit-Limit / RateLimit-Remaining / RateLimit-Reset
// headers (draft-ietf-httpapi-ratelimit-headers) or the common
// X-RateLimit-* ones. A field that was absent is -1 (counts) or 0
// (durations).
type RateLimitInfo struct {
	// Limit is the budget of one window, in calls; -1 when absent.
	Limit int64
	// Remaining is what is left of the budget, in calls; -1 when absent.
	Remaining int64
	// Reset is the time until the budget is renewed, measured from the
	// answer; 0 when absent.
	Reset time.Duration
	// Window is the length of the window of Limit (a w= parameter or a
	// RateLimit-Policy header); 0 when absent.
	Window time.Duration
}

type rateLimitKey struct{}

// WithRateLimitReport returns a context carrying fn, which a sink calls with
// the rate-limit headers of each response that carried any (success or
// failure), before Send returns. The lane's adaptive rate uses it (SPEC §3
// Adaptive rate, headers: true).
func WithRateLimitReport(ctx context.Context, fn func(RateLimitInfo)) context.Context {
	return context.WithValue(ctx, rateLimitKey{}, fn)
}

// RateLimitReportFrom returns the function set by WithRateLimitReport, or nil.
func RateLimitReportFrom(ctx context.Context) func(RateLimitInfo) {
	fn, _ := ctx.Value(rateLimitKey{}).(func(RateLimitInfo))
	return fn
}
