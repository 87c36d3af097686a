package shaper

import (
	"math"
	"time"
)

// Pacer decides departure times for one lane: the leaky bucket used as a queue
// (nginx limit_req without nodelay), implemented by virtual scheduling, the
// algorithm of GCRA and of go.uber.org/ratelimit. It keeps the theoretical
// time of the next departure (tat), advances it by one emission interval per
// departure, and never lets it lag behind the clock by more than the slack
// allows, so idle, paused or blocked time earns no credit (SPEC G2).
//
// On top of the plain schedule it enforces the rules of SPEC G1 and §3:
//
//   - Spacing. Up to 1,000/s and with slack 0, two consecutive departures are
//     never closer than 0.99 intervals. A departure that left late (the timer
//     woke late, the process stalled) is made up by at most 1 % of an interval
//     per departure, and only while the lag is below 0.9 interval (a lag
//     below one interval keeps every window of a whole number of intervals
//     within the bound);
//     beyond that the lateness is forgiven rather than caught up (NOTES: a
//     pacer that catches up a stall releases a burst).
//   - Warmup. A cold lane runs at limit/cold_factor; its warmth w in [0,1]
//     rises by 1/period per second while the bucket holds messages and falls
//     at the same slope while it is empty; the rate is
//     limit × (1/cold_factor + (1 − 1/cold_factor) × w). This is the idea of
//     Guava's SmoothWarmingUp (warm by doing work, cool by idling) with a
//     ramp that is linear in time rather than in stored permits, so that the
//     ramp is reached by any demand, not only by demand at the full rate
//     (Guava issue 3552). Each departure uses the rate at its own time for the
//     interval to the next one, so under a backlog the departures up to any
//     time t never exceed the integral of the rate plus 1.
//   - Pause. Pause(until) holds all departures until that instant (a
//     downstream's Retry-After on 429/503); afterwards the schedule restarts
//     from the end of the pause with no credit for the paused time.
//
// A Pacer is not safe for concurrent use: one departure loop owns it (the
// drain package guards it with the lane's mutex). All methods are pure
// functions of the times passed in; none reads the clock, sleeps or blocks.
type Pacer struct {
	limit      Limit
	slack      int
	period     time.Duration // warmup period, 0 = off
	coldFactor float64       // ≥ 1

	tat  time.Time // theoretical departure time of the next message
	last time.Time // actual time of the previous departure; zero = none yet

	pausedUntil time.Time
	wireDelay   time.Duration // moving estimate of departure → wire

	warmth   float64   // w in [0,1]
	warmedAt time.Time // instant up to which warmth is integrated
	busy     bool      // bucket held messages since warmedAt
}

// PacerConfig is the rate configuration of one lane.
type PacerConfig struct {
	// Limit is the rate after warmup, in messages per second. Required.
	Limit Limit
	// Slack is how many departures may leave early after an idle spell,
	// in messages (the burst tolerance of GCRA). 0 = none, a pure leaky bucket.
	Slack int
	// WarmupPeriod is the time a cold lane needs under work to reach Limit;
	// 0 turns warmup off.
	WarmupPeriod time.Duration
	// ColdFactor divides Limit to give the cold rate; ≥ 1. Ignored when
	// WarmupPeriod is 0.
	ColdFactor float64
}

// spacingMaxRate is the rate up to which consecutive departures are kept at
// least spacingFactor intervals apart (SPEC G1).
const (
	spacingMaxRate = 1000
	spacingFactor  = 0.99
	// lagFraction bounds, as a fraction of an interval, how far the schedule
	// may lag behind a late departure and still be caught up.
	lagFraction = 0.9
)

// NewPacer returns a pacer for cfg, cold when warmup is on (SPEC §3: a lane
// starts cold at process start), with no departure yet. start is the instant
// the lane starts; warmth integration begins there. Invalid values are clamped
// (Limit ≤ 0 to 1/s, Slack < 0 to 0, ColdFactor < 1 to 1): configuration is
// validated before it reaches here.
func NewPacer(cfg PacerConfig, start time.Time) *Pacer {
	p := &Pacer{warmedAt: start}
	p.SetConfig(cfg, start)
	return p
}

// SetConfig changes the rate configuration in place from now on, keeping the
// schedule and the warmth (hot reload).
func (p *Pacer) SetConfig(cfg PacerConfig, now time.Time) {
	p.advanceWarmth(now)
	if cfg.Limit <= 0 || math.IsInf(float64(cfg.Limit), 0) || math.IsNaN(float64(cfg.Limit)) {
		cfg.Limit = 1
	}
	if cfg.Slack < 0 {
		cfg.Slack = 0
	}
	if cfg.ColdFactor < 1 {
		cfg.ColdFactor = 1
	}
	if cfg.WarmupPeriod < 0 {
		cfg.WarmupPeriod = 0
	}
	p.limit, p.slack, p.period, p.coldFactor = cfg.Limit, cfg.Slack, cfg.WarmupPeriod, cfg.ColdFactor
	if p.period == 0 {
		p.warmth = 1
	}
}

// SetBusy records at now whether the bucket holds messages; warmth rises while
// busy and falls while not. Call it on every change (and it is harmless to
// call it more often).
func (p *Pacer) SetBusy(now time.Time, busy bool) {
	p.advanceWarmth(now)
	p.busy = busy
}

func (p *Pacer) advanceWarmth(now time.Time) {
	if now.After(p.warmedAt) {
		if p.period > 0 {
			dw := now.Sub(p.warmedAt).Seconds() / p.period.Seconds()
			if p.busy {
				p.warmth = math.Min(1, p.warmth+dw)
			} else {
				p.warmth = math.Max(0, p.warmth-dw)
			}
		}
		p.warmedAt = now
	}
}

// Warmth returns w in [0, 1] at now (1 when warmup is off).
func (p *Pacer) Warmth(now time.Time) float64 {
	p.advanceWarmth(now)
	return p.warmth
}

// Rate returns the rate in force at now, in messages per second: the warmup
// ramp included, 0 while paused. It is what shaper_rate_limit_per_second shows.
func (p *Pacer) Rate(now time.Time) float64 {
	if now.Before(p.pausedUntil) {
		return 0
	}
	return p.rate(now)
}

// RampRate returns the rate at now ignoring any pause: the limit with the
// warmup ramp applied, in messages per second.
func (p *Pacer) RampRate(now time.Time) float64 { return p.rate(now) }

func (p *Pacer) rate(now time.Time) float64 {
	p.advanceWarmth(now)
	if p.period == 0 {
		return float64(p.limit)
	}
	inv := 1 / p.coldFactor
	return float64(p.limit) * (inv + (1-inv)*p.warmth)
}

// interval is the emission interval at now, in nanoseconds as a float.
func (p *Pacer) interval(now time.Time) time.Duration {
	return time.Duration(float64(time.Second) / p.rate(now))
}

// Pause holds departures until the instant until (inclusive of earlier
// pauses: the later end wins). A pause in the past has no effect.
func (p *Pacer) Pause(until time.Time) {
	if until.After(p.pausedUntil) {
		p.pausedUntil = until
	}
}

// PausedUntil returns the end of the current pause, or the zero time.
func (p *Pacer) PausedUntil() time.Time { return p.pausedUntil }

// Next returns the earliest instant at which the next departure may leave,
// given that a message and a task slot are ready at now. It is ≥ now; it is
// now when the departure may leave at once. Next does not change the schedule.
func (p *Pacer) Next(now time.Time) time.Time {
	at := p.tat
	iv := p.interval(now)
	if p.slack > 0 {
		at = at.Add(-time.Duration(p.slack) * iv)
	} else if !p.last.IsZero() && p.rate(now) <= spacingMaxRate {
		if floor := p.last.Add(time.Duration(spacingFactor * float64(iv))); floor.After(at) {
			at = floor
		}
	}
	if p.pausedUntil.After(at) {
		at = p.pausedUntil
	}
	if at.Before(now) {
		return now
	}
	return at
}

// Depart records a departure that actually left at now, for a message (and a
// task slot) that had been ready since ready (ready ≤ now). The schedule
// advances by one interval from its own time for this departure — the GCRA
// time, or ready when the work came later — so a waiter's lateness is made up
// (under 0.9 interval, at 1 % per departure, see the type's doc), while
// waiting for work or for a slot earns nothing (SPEC G2).
func (p *Pacer) Depart(ready, now time.Time) {
	if ready.After(now) {
		ready = now
	}
	iv := p.interval(now)
	// The schedule's own time for this departure: the GCRA earliest time
	// (slack and pause included, the spacing floor not), or when the work
	// became ready if that was later.
	sched := p.tat
	if p.slack > 0 {
		sched = sched.Add(-time.Duration(p.slack) * iv)
	}
	if p.pausedUntil.After(sched) {
		sched = p.pausedUntil
	}
	if ready.After(sched) {
		sched = ready
	}
	base := p.tat
	if sched.After(base) {
		base = sched
	}
	maxLag := time.Duration(lagFraction * float64(iv))
	if p.rate(now) > spacingMaxRate {
		// Above 1,000/s the pacer may release small batches (SPEC G1): a late
		// wake-up may be made up by up to one interval, which keeps the count
		// in any window of a whole number of intervals within the bound.
		maxLag = iv - 1
	}
	if floor := now.Add(-maxLag); floor.After(base) {
		base = floor
	}
	p.tat = base.Add(iv)
	p.last = now
}

// Wire records that the departure which left at departed actually reached
// the wire at wired (see WithWire). Every request pays the usual delay from
// departure to wire (a goroutine and a write, ~0.1–0.3 ms) alike, so only the
// extra over a moving estimate of that delay moves the anchor of the spacing
// floor: a request that reached the wire late pushes the next departure back
// by its lateness, and Wire reports true (the next departure's time moved).
func (p *Pacer) Wire(departed, wired time.Time) bool {
	d := max(wired.Sub(departed), 0)
	// The estimate starts at 0, not at the first sample: the first request
	// pays the connection's dial, which is not usual (it once let the second
	// request reach the downstream 1 ms after the first). Moving average with
	// 1/8 weight, of samples clamped to twice the estimate (+1 µs so that it
	// can grow from 0 within some 60 requests), so that one stuck request
	// does not inflate it.
	usual := p.wireDelay
	p.wireDelay = usual + (min(d, 2*usual+time.Microsecond)-usual)/8
	anchor := wired.Add(-min(usual, d))
	if anchor.After(p.last) {
		p.last = anchor
		return true
	}
	return false
}

// Rebase makes the schedule continue one interval (at the rate in force at
// now) after the previous departure, with no lateness to make up. Use it
// when something else timed the departures — a shared schedule across
// replicas (SPEC §3 Global rate), whose slots make this pacer look late at
// every departure — and this pacer takes over: without it, that apparent
// lateness would be caught up at 1 % per departure (see the type's doc).
// Without a previous departure it does nothing.
func (p *Pacer) Rebase(now time.Time) {
	if p.last.IsZero() {
		return
	}
	p.tat = p.last.Add(p.interval(now))
}
