package shaper

import (
	"math"
	"time"
)

// Pacer decides departure times for one lane: the leaky bucket used as a queue
// (nginx limit_req without nodelay), implemented by virtual scheduling, the
// algorithm of GCRA and of go.uber.org/ratelimit. It keeps the theoretical
// time of the next departure (tat), advances it by one emission interval per
// departure, and never lets it lag behind the clock by more than the make-up
// allows, so idle, paused or blocked time earns no credit beyond the slack
// (SPEC G2). The rules of SPEC G1 and §3 live here and nowhere else:
//
//   - Make-up. A departure that left late (the waiter woke late, the process
//     stalled) does not move the schedule: the next one is still due one
//     interval after the late one's scheduled time, so lateness does not cost
//     rate. The schedule may lag behind the clock by at most MakeUpLag
//     (under one interval); lateness beyond it is forgiven, never caught up
//     in a burst (NOTES: a pacer that catches up a stall releases one).
//   - Spacing. With slack 0, two consecutive departures are never closer
//     than min_spacing intervals (SPEC G1 asks for it up to 1,000/s; the
//     pacer keeps it at every rate, see floored): lateness is made up by
//     leaving at most (1 − min_spacing) of an interval early, departure by
//     departure. With min_spacing 1.0 nothing leaves early and lateness is
//     lost. With slack > 0 there is no floor between consecutive
//     departures; the lag bound is then chosen so that every window holds
//     SPEC G1's bound (see MakeUpLag).
//   - Windows. These two rules give, for the departures of the pacer, at
//     most W × limit + 1 + slack in any window of a whole number of intervals
//     and floor(W × limit / min_spacing) + 1 + slack in any other window
//     (W ≥ 1/limit, and W ≥ 1 ms above 1,000/s). docs/design.md has the proof.
//   - Slack. After idling, 1 + slack departures may leave at once (the GCRA
//     burst tolerance, slack intervals of credit); waiting for work, for a
//     task slot or for the end of a pause earns that credit, once, and no
//     more. A change of rate (hot reload, adaptive rate, the Redis fallback)
//     keeps the credit as it was, in departures (SetConfig); Rebase drops it.
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
//     downstream's Retry-After on 429/503, an operator); the paused time
//     earns at most the slack, like idle time.
//   - Hold. Hold(now, true) marks the lane as held by something other than
//     its pacer (an open breaker, an operator's pause): it cools as if
//     idle, so that the end of the hold goes through the warmup ramp.
//
// A Pacer is not safe for concurrent use: one departure loop owns it (the
// drain package guards it with the lane's mutex). All methods are pure
// functions of the times passed in; none reads the clock, sleeps or blocks.
type Pacer struct {
	limit      Limit
	slack      int
	minSpacing float64       // (0, 1]
	period     time.Duration // warmup period, 0 = off
	coldFactor float64       // ≥ 1

	tat  time.Time // theoretical departure time of the next message
	last time.Time // actual time of the previous departure; zero = none yet

	pausedUntil time.Time
	heldEnded   time.Time     // when the last hold ended (Hold)
	wireDelay   time.Duration // moving estimate of departure → wire

	forgivenLate time.Duration // lateness beyond the make-up, not yet taken (TakeForgiven)
	forgivenWire time.Duration // schedule moved by late wire reports, not yet taken
	// wireLeast is the earliest the next departure may be after the wire
	// reports so far (Wire): a reload (SetConfig) or a Rebase does not move
	// the schedule before it, whatever instant it is given.
	wireLeast time.Time
	// wireLast is the latest wire report (Wire): up to SpacingMaxRate the
	// next request's first byte waits for it + min_spacing intervals
	// (WireSpacing).
	wireLast time.Time
	// spans are the latest departures with slack 0 (at every rate: a
	// change across SpacingMaxRate needs them) and their wire reports,
	// oldest first, for the span floor (spanFloor).
	spans []spanMark

	warmth   float64   // w in [0,1]
	warmedAt time.Time // instant up to which warmth is integrated
	busy     bool      // bucket held messages since warmedAt
	held     bool      // the lane is held (Hold) since warmedAt
}

// PacerConfig is the rate configuration of one lane.
type PacerConfig struct {
	// Limit is the rate after warmup, in messages per second. Required.
	Limit Limit
	// Slack is how many departures may leave early after an idle spell,
	// in messages (the burst tolerance of GCRA). 0 = none, a pure leaky bucket.
	Slack int
	// MinSpacing is how close, in intervals, two consecutive departures may
	// come while lateness is made up (SPEC G1, rate.min_spacing), in (0, 1].
	// 0 means DefaultMinSpacing.
	MinSpacing float64
	// WarmupPeriod is the time a cold lane needs under work to reach Limit;
	// 0 turns warmup off.
	WarmupPeriod time.Duration
	// ColdFactor divides Limit to give the cold rate; ≥ 1. Ignored when
	// WarmupPeriod is 0.
	ColdFactor float64
}

// DefaultMinSpacing is the default of rate.min_spacing (SPEC §4): a
// departure may leave up to 5 % of an interval early to make up lateness,
// room for the lateness of a loaded machine (NOTES.md: a waiter ~20–30 µs
// late is 2–3 % of an interval at 1,000/s).
const DefaultMinSpacing = 0.95

// SpacingMaxRate is the rate, in messages per second, up to which
// consecutive departures keep min_spacing between them (SPEC G1); above it
// the pacer may release small batches and G1's windows are required for
// W ≥ BatchWindow.
const SpacingMaxRate = 1000

// BatchWindow is the shortest window for which SPEC G1's bound is required
// above SpacingMaxRate.
const BatchWindow = time.Millisecond

// jitterMargin is the share of an interval the lag may reach with the spacing
// floor. Any lag under one interval keeps every window of a whole number of
// intervals at W × limit + 1 at departure; the last tenth is left for the
// jitter between departure and downstream, so that the windows hold where
// the downstream counts them too (at 200/s a lag of up to 1 ns under the
// interval let a 1 s window at the downstream hold 202: 202 departures span
// just over 1 s, and 0.4 ms of jitter brought them under it).
const jitterMargin = 0.9

// jitterBudget is the jitter between departure and downstream that the
// make-up lag leaves room for, up to SpacingMaxRate, where it is more than a
// tenth of an interval: loopback jitter measured 25–110 µs, and 300–430 µs
// when a write was descheduled (sinks' HTTP wire test at kernel timestamps,
// where a lag of 0.9 ms at 1,000/s let 100 ms windows hold 102). Above
// 1,000/s the jitter is several intervals and the windows at the downstream
// are the wire's to keep (the lane waits for each request's write).
const jitterBudget = 400 * time.Microsecond

// MakeUpLag is how far, at most, the schedule of a lane at interval iv may
// lag behind the departures (the lateness that is still made up), for the
// given slack and min_spacing. With the spacing floor (slack 0) it is 0.9
// interval: a lag below one interval keeps every window of a whole number
// of intervals at W × limit + 1, the floor bounds the others, and the last
// tenth is the budget for jitter on the way to the downstream. Without the floor it is
// what keeps every other window W ≥ W₀ (W₀ = 1/limit, or BatchWindow above
// SpacingMaxRate) at floor(W × limit / s) + 1 + slack: with k = floor(W₀ ×
// limit), a lag of (1 − s)(k + 1) intervals. (A window of w = j + δ
// intervals, j ≥ k, holds at most j + 1 + slack departures when δ + lag < 1,
// and floor(w/s) ≥ j + 1 as soon as δ ≥ s − j(1 − s).) min_spacing 1 gives 0
// without the floor: nothing is made up.
func MakeUpLag(iv time.Duration, slack int, minSpacing float64) time.Duration {
	minSpacing = clampSpacing(minSpacing)
	under := iv - 1 // strictly under one interval
	if iv <= 0 {
		return 0
	}
	if slack == 0 {
		lag := time.Duration(jitterMargin * float64(iv))
		if iv >= time.Second/SpacingMaxRate {
			lag = max(0, min(lag, iv-jitterBudget))
		}
		return lag
	}
	return min(makeUpFree(iv, minSpacing), under)
}

// makeUpFree is the lag that windows allow to be made up with no spacing
// floor: (1 − s)(k + 1) intervals, k = floor(W₀ × limit) (see MakeUpLag).
func makeUpFree(iv time.Duration, minSpacing float64) time.Duration {
	k := 1.0
	if iv < BatchWindow {
		k = math.Floor(float64(BatchWindow) / float64(iv))
	}
	return time.Duration((1 - minSpacing) * (k + 1) * float64(iv))
}

// SlotTolerance is how late after its slot of a schedule shared by
// replicas (SPEC §3 Global rate) a departure may still leave: the slack's
// credit plus SlotMakeUp. A slot used later than that is dropped, never
// given back as a burst: the departures of all replicas then keep SPEC G1's
// windows and spacing as one lane's would. (The shared schedule makes a
// slot dropped after a late wake-up up within MakeUpLag: redisslots.)
func SlotTolerance(iv time.Duration, slack int, minSpacing float64) time.Duration {
	return time.Duration(slack)*iv + SlotMakeUp(iv, minSpacing)
}

// SlotMakeUp is the lateness a shared schedule makes up, for a late request
// (the schedule places its slot that far behind the store's clock) and for a
// departure late after its slot. Up to SpacingMaxRate it is (1 − min_spacing)
// intervals: one replica cannot see the next replica's departure, so the
// spacing floor must hold slot to slot. Above it, where G1 speaks of windows
// of 1 ms or more only, it is the floor-free make-up of MakeUpLag.
func SlotMakeUp(iv time.Duration, minSpacing float64) time.Duration {
	minSpacing = clampSpacing(minSpacing)
	if iv >= time.Second/SpacingMaxRate {
		return time.Duration((1 - minSpacing) * float64(iv))
	}
	return min(makeUpFree(iv, minSpacing), iv-1)
}

// SlotRepayMax is the most a shared schedule at interval iv may space two
// consecutive slots closer than iv while it repays the make-up of dropped
// slots: SlotMakeUp, but with slack 0 no more than (1 − min_spacing)
// intervals, at every rate. A replica's own pacer then keeps min_spacing
// between its departures (Pacer.floored), so it reaches a slot spaced
// closer than that only after the slot, by the difference: at 2,500/s the
// floor-free 60 µs put it 40 µs past slots whose tolerance is 60 µs, and the
// slots it then dropped were owed again (TestRedisLastSlotNotStale).
func SlotRepayMax(iv time.Duration, slack int, minSpacing float64) time.Duration {
	m := SlotMakeUp(iv, minSpacing)
	if slack > 0 {
		return m
	}
	return min(m, time.Duration((1-clampSpacing(minSpacing))*float64(iv)))
}

func clampSpacing(s float64) float64 {
	if s <= 0 || s > 1 || math.IsNaN(s) {
		return DefaultMinSpacing
	}
	return s
}

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
// schedule and the warmth (hot reload, adaptive rate, the Redis fallback).
// A change of rate keeps the schedule in departures, not in time: the
// distance from the previous departure to the next theoretical one (one
// interval, less any lag being made up, plus the slack's lead under a
// backlog) is scaled to the new interval. So the next gap is the new
// interval, and a reload neither releases the slack again nor costs the
// lane its place (SPEC G2: a reload earns no credit).
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
	cfg.MinSpacing = clampSpacing(cfg.MinSpacing)
	var oldIv time.Duration
	oldSlack := p.slack
	if p.limit > 0 && !p.tat.IsZero() {
		oldIv = p.interval(now)
	}
	p.limit, p.slack, p.minSpacing, p.period, p.coldFactor = cfg.Limit, cfg.Slack, cfg.MinSpacing, cfg.WarmupPeriod, cfg.ColdFactor
	if p.period == 0 {
		p.warmth = 1
	}
	if oldIv > 0 {
		newIv := p.interval(now)
		if newIv != oldIv && !p.last.IsZero() {
			ahead := float64(p.tat.Sub(p.last)) * float64(newIv) / float64(oldIv)
			p.tat = p.last.Add(time.Duration(ahead))
			// The lag being made up may be no more than the new rate
			// allows (MakeUpLag differs with and without the floor).
			if least := p.last.Add(newIv - MakeUpLag(newIv, p.slack, p.minSpacing)); p.tat.Before(least) {
				p.tat = least
			}
			// A backlog that waited on the old rate's schedule is not late
			// on the new one: the change must not turn that wait into lag
			// to make up (a reload from 1/h back to 100/s made up most of
			// an interval with 0.95-interval gaps).
			if p.busy && p.tat.Before(now) {
				p.tat = now
			}
		}
		// A larger slack is credit to be earned by idle time, not given
		// now: the next departure stays where it was.
		p.tat = p.tat.Add(time.Duration(p.slack-oldSlack) * p.limit.Interval())
		// Nor before what the wire reports asked for: a faster rate shrinks
		// the schedule's lead from the last departure, and a lane may apply
		// it with an instant read before the last report (found by a review
		// helper: a request stamped at its tile's end, then a reload from
		// 1,200/s to 1,250/s, put 27 requests in a 20 ms window, bound 26).
		if p.tat.Before(p.wireLeast) {
			p.tat = p.wireLeast
		}
	}
}

// SetBusy records at now whether the bucket holds messages; warmth rises while
// busy and falls while not. Call it on every change (and it is harmless to
// call it more often).
func (p *Pacer) SetBusy(now time.Time, busy bool) {
	p.advanceWarmth(now)
	p.busy = busy
}

// Hold records at now whether the lane is held: its departures stopped by
// something other than the pacer's schedule, for an unknown time — an open
// breaker (SPEC §3 Breaker), an operator's pause (SPEC §3 Operator control).
// While held, warmth integrates as if the bucket were empty, falling by
// 1/period per second whatever SetBusy says (SPEC §3 Warmup: the downstream
// cools when it does no work), so that when the hold ends the lane resumes
// through the warmup ramp from the warmth it cooled to; and Rate reports 0.
// Hold does not itself stop departures (Next and Depart are unchanged, so a
// breaker's probe still leaves on the schedule): the caller stops them. Like
// idle time, held time earns no credit beyond the slack (SPEC G2). Call it
// on every change; it is harmless to call it more often.
func (p *Pacer) Hold(now time.Time, held bool) {
	p.advanceWarmth(now)
	if p.held && !held {
		p.heldEnded = now
	}
	p.held = held
}

// Held reports whether the lane is held (Hold).
func (p *Pacer) Held() bool { return p.held }

func (p *Pacer) advanceWarmth(now time.Time) {
	if now.After(p.warmedAt) {
		if p.period > 0 {
			dw := now.Sub(p.warmedAt).Seconds() / p.period.Seconds()
			if p.busy && !p.held {
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
// ramp included, 0 while paused or held (Hold). It is what shaper_rate_limit_per_second shows.
func (p *Pacer) Rate(now time.Time) float64 {
	if p.held || now.Before(p.pausedUntil) {
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

// interval is the emission interval at now (the warmup ramp included).
func (p *Pacer) interval(now time.Time) time.Duration {
	return Limit(p.rate(now)).Interval()
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
	iv := p.interval(now)
	at := p.tat.Add(-p.credit())
	if p.floored() && !p.last.IsZero() {
		if floor := p.last.Add(time.Duration(p.minSpacing * float64(iv))); floor.After(at) {
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

// floored reports whether consecutive departures keep min_spacing: with
// slack 0, at every rate. SPEC G1 asks for the floor up to SpacingMaxRate
// and lets the pacer release small batches above it; keeping the floor
// there too costs no wake-ups (a lag under one interval releases one
// departure per wake-up either way) and lets the lag run to just under an
// interval instead of the 55–75 µs the windows allow without it, which on
// this machine halved the rate lost to late wake-ups at 5,000–10,000/s
// (−0.8 % instead of −1.6 % at 5,000/s beside a CPU hog, bench long-run).
func (p *Pacer) floored() bool {
	return p.slack == 0
}

// Depart records a departure that actually left at now, for a message (and a
// task slot) that had been ready since ready (ready ≤ now). The schedule
// advances by one interval from its own time for this departure: the
// theoretical time, or when the work became ready (or the pause ended) if
// that was later — so waiting earns at most the slack — or now − MakeUpLag
// if the departure was later still: lateness up to that lag is made up
// (see the type's doc), beyond it is forgiven.
func (p *Pacer) Depart(ready, now time.Time) {
	if ready.After(now) {
		ready = now
	}
	if p.pausedUntil.After(ready) && !p.pausedUntil.After(now) {
		ready = p.pausedUntil
	}
	// Held time is not lateness either (Hold): a departure while held (a
	// breaker's probe) was ready now, and the first after a hold when it
	// ended. Else an operator's 5 s pause of a lane with a backlog showed
	// as 5 s of rate given up (shaper_departure_lateness_forgiven_seconds_total,
	// found by a new-user pass).
	if p.held {
		ready = now
	} else if p.heldEnded.After(ready) && !p.heldEnded.After(now) {
		ready = p.heldEnded
	}
	iv := p.interval(now)
	base := p.tat
	if ready.After(base) {
		base = ready
	}
	lag := MakeUpLag(iv, p.slack, p.minSpacing)
	if !p.floored() {
		// During warmup the interval is longer than the limit's; without
		// the floor, a lag in those longer intervals would be a burst in
		// the limit's, so the limit's make-up is the most.
		lag = min(lag, MakeUpLag(p.limit.Interval(), p.slack, p.minSpacing))
	}
	if floor := now.Add(-lag); floor.After(base) {
		p.forgivenLate += floor.Sub(base)
		base = floor
	}
	p.tat = base.Add(iv)
	p.last = now
	if p.floored() { // at every rate: a change across SpacingMaxRate needs the history
		p.markSpan(now, iv)
	}
}

// WireFloor is the span floor of the next departure at now (see
// spanFloor): the earliest instant it may leave so that, stamped no earlier
// than its departure, its request keeps every window of 1 ms or more at the
// downstream within SPEC G1's bound. A lane whose sink gates its writes
// holds its departures to it (drain.Lane.departureAt); the zero time when
// there is none (up to SpacingMaxRate, with slack, before any wire report).
func (p *Pacer) WireFloor(now time.Time) time.Time { return p.spanFloor(p.interval(now)) }

// Wire records that the departure which left at departed actually reached
// the wire at wired (see WithWire). Every request pays the usual delay from
// departure to wire (a goroutine and a write, ~0.1–0.3 ms) alike, so only the
// extra over a moving estimate of that delay moves the anchor of the spacing
// floor, up to SpacingMaxRate: a request that reached the wire late pushes
// the next departure back by its lateness. Wire reports true when the next
// departure's time moved.
//
// Above SpacingMaxRate the make-up's lag is judged at the wire against the
// whole delay instead: a request counts as having left when it reached the
// wire. Judged against the usual delay, a request at the lag's end and, 51
// intervals later, a fast one put 52 requests in a 10 ms window at the
// downstream at 5,000/s (the bench's section 11: the delay fell from
// 60–120 µs to 35–45 µs within that window, more than the tenth of an
// interval the lag leaves for jitter). Judged against the quickest delay
// seen (sessions 18–24), the start of a run broke the same window: while
// the pool dials its connections every delay is slow, the quickest seen was
// 54–133 µs, and the requests after it took 16 µs (2 runs of 4 at the
// downstream's kernel stamps, 52 in 9,920 and 9,990 µs;
// TestPacerWindowsHoldWhenTheWireGetsFaster, seeds 21–40). The whole delay
// needs no estimate and costs no rate here: it moves the schedule only
// where a request's delay, plus the lateness being made up, exceeds the lag
// (then 0.9 interval): 4 alternated runs of each at 5,000/s, −0.27 to
// −0.36 % against −0.22 to −0.47 %, the closest 52 requests 39–47 µs
// beyond 10 ms.
//
// Judged against the whole delay, the lag there (slack 0) is a whole
// interval, not 0.9 of one, when the report is exact (WithWire: the request
// was written whole to this host's loopback, where the downstream's kernel
// stamps it inside the write): the tiles. Call g_n the schedule's time when
// request n departs. It departs at or after g_n, so the downstream's kernel
// stamps it after g_n, and no later than its exact report. (A departure
// that a lane released a lead before its instant, to a sink that gates its
// writes, counts at that instant, and the sink writes nothing of the
// request before it: drain/gate.go, shaper.WithGate.) The report moves
// the schedule to at least itself (g_{n+1} ≥ wired; a reload or a Rebase
// keeps that, wireLeast), so each request reaches the downstream within its
// own tile (g_n, g_{n+1}], and the tiles, each at least an interval long
// (Limit.Interval rounds up), do not overlap. A window of k intervals, closed or not,
// meets at most k + 1 tiles, so it holds at most k + 1 requests (SPEC G1),
// whatever the delays. The tenth of an interval kept back before moved the
// schedule 1,926 times in one run at 5,000/s through the HTTP sink, 1,465
// of them for requests whose whole delay was under an interval; without it
// the rate moved by +0.07 % (median of 11 alternated pairs of runs, from
// −0.53 to +1.66 %): within this machine's noise, as the loop, woken by the
// report, now has no tenth to wake in (bench section 11; docs/performance.md,
// session 28).
// Tests: TestPacerWireTilesHoldTheWindows (a lag of 1.05 intervals breaks
// 1 ms windows), TestPacerWireLagIsAnIntervalAboveSpacingMaxRate. With
// slack the schedule may run ahead of the tiles by the slack's credit, and
// the lag stays MakeUpLag's; so it does for a report that is not exact
// (HTTP/2, where another stream's write may report it; a caller's client;
// NATS with several publishes under way; a downstream across a network,
// whose jitter the tenth of an interval is a budget for).
func (p *Pacer) Wire(departed, wired time.Time, exact bool) bool {
	return p.WireHeld(departed, 0, wired, exact)
}

// WireSpacing is the earliest instant, as seen at now, at which the next
// request's first byte may be written: min_spacing intervals after the
// latest wire report (Wire), up to SpacingMaxRate with slack 0, where SPEC
// G1 asks for min_spacing between consecutive requests at the downstream;
// the zero time otherwise, and before any report. A lane whose sink gates
// its writes holds each write to it (drain/gate.go).
//
// Why: the spacing floor of the departures is anchored at the previous
// report less the usual delay from departure to wire (Wire), so a request
// quicker than usual reached the downstream early by the difference, after
// a slower one: 4.593 ms after it at 200/s, under 0.95 × 5 ms, at the
// downstream's kernel stamps (a new user's run, session 33), and 0.84–0.89
// intervals at 1,000/s (TestHTTPWireRate). An exact report comes after the
// kernel stamped the request (WithWire), and the next request is stamped
// after its first byte's write began, so the stamps keep min_spacing
// whatever the delays. Its cost: a request held here departed later, as
// far as the make-up is concerned (WireHeld), and a departure makes up at
// most 1 − min_spacing of an interval less the hold. Tests:
// TestPacerWireSpacing, TestLaneGateKeepsSpacingAtTheWire,
// TestHTTPWireRate (asserts the spacing at the kernel stamps).
func (p *Pacer) WireSpacing(now time.Time) time.Time {
	if !p.floored() || p.wireLast.IsZero() {
		return time.Time{}
	}
	iv := p.interval(now)
	if iv < time.Second/SpacingMaxRate {
		return time.Time{}
	}
	// Rounded up: a floor a nanosecond early is not a floor.
	return p.wireLast.Add(time.Duration(math.Ceil(p.minSpacing * float64(iv))))
}

// WireHeld is Wire for a request whose first byte was held for held after
// it could have been written (WireSpacing): as far as the usual delay and
// the make-up are concerned it departed that much later.
func (p *Pacer) WireHeld(departed time.Time, held time.Duration, wired time.Time, exact bool) bool {
	if wired.After(p.wireLast) {
		p.wireLast = wired
	}
	span := departed // the span floor's mark is the departure's own
	departed = departed.Add(max(held, 0))
	d := max(wired.Sub(departed), 0)
	// The estimate starts at 0, not at the first sample: the first request
	// pays the connection's dial, which is not usual (it once let the second
	// request reach the downstream 1 ms after the first). Moving average with
	// 1/8 weight, of samples clamped to twice the estimate (+1 µs so that it
	// can grow from 0 within some 60 requests), so that one stuck request
	// does not inflate it.
	usual := p.wireDelay
	p.wireDelay = usual + (min(d, 2*usual+time.Microsecond)-usual)/8
	moved := false
	iv := p.interval(wired)
	// The spacing floor is anchored at the wire up to SpacingMaxRate, where
	// SPEC G1 asks for min_spacing between consecutive requests; above it G1
	// asks for windows of 1 ms or more only, which the lag below keeps at
	// the wire, and the floor stays at the departures. Anchored at the wire
	// there, every request slower than usual pushed the next one back by
	// its excess (30 µs a request on average at 5,000/s here, three times
	// the 10 µs a departure makes up): the lane reached 85–91 % of 5,000/s
	// through the HTTP sink, and 95–96 % without it, its 1 ms and 10 ms
	// windows held at the downstream's kernel stamps either way (bench
	// section 11, docs/performance.md).
	// left is when the request counts as having left: its wire report less
	// the usual delay up to SpacingMaxRate, the report itself above (the
	// whole delay is lateness, see the doc).
	spaced := iv >= time.Second/SpacingMaxRate // up to SpacingMaxRate
	left := wired
	if spaced {
		left = wired.Add(-min(usual, d))
		if left.After(p.last) {
			p.last, moved = left, true
		}
	}
	// The lag made up after this request counts from when it really left:
	// a request that reached the wire late is a late departure, and the
	// make-up may not add to its lateness (else a window at the downstream
	// that starts on it holds one more).
	// Up to SpacingMaxRate the lag leaves jitterBudget (400 µs) for the
	// jitter to the downstream, more than the delay's spread on loopback
	// (25–110 µs), and is judged against the usual delay; above, with slack
	// 0, it is a whole interval, judged against the whole delay (the tiles,
	// see the doc). (Judged against the
	// quickest delay at every rate, the demo at 100/s failed twice in one
	// CI run, at 98.8 and 99.2 % of its limit, TestDemoRunsClean, and passed
	// on an idle machine; nothing below 1,000/s asked for the change, so it
	// is not made there.)
	lag := MakeUpLag(iv, p.slack, p.minSpacing)
	if exact && !spaced && p.floored() {
		lag = iv // the tiles (see the doc)
	}
	if p.floored() {
		// The span floor (spanFloor): the downstream stamped the request
		// by wired, or later by the lag's jitter budget for a report that
		// is not exact (a tenth of an interval above SpacingMaxRate).
		stamped := wired
		if !exact {
			stamped = wired.Add(iv - MakeUpLag(iv, p.slack, p.minSpacing))
		}
		p.wireSpan(span, stamped)
	}
	least := left.Add(iv - lag)
	if p.tat.Before(least) {
		p.forgivenWire += least.Sub(p.tat)
		p.tat, moved = least, true
	}
	if least.After(p.wireLeast) {
		p.wireLeast = least
	}
	return moved
}

// spanMark is one departure of Pacer.spans: when it left, and the latest
// instant its request can have reached the downstream (its wire report, and
// the jitter budget of a report that is not exact); zero until reported.
type spanMark struct {
	departed, stamped time.Time
}

// maxSpanMarks bounds Pacer.spans. With min_spacing under 1 the floor
// needs spanLast entries (21 at 0.95); with 1.0, spanFirst (101 at
// 100,000/s). A lane with min_spacing 1.0 faster than the bound allows
// has no span floor.
const maxSpanMarks = 4096

// spanLast is the most gaps, m, that the span floor must keep apart at
// min_spacing s (it holds only for spanFirst ≤ spanLast): beyond 1 / (1 −
// s) the tiles (Wire) are enough. They put
// m + 1 requests more than m − 1 intervals apart, and a window of W > (m −
// 1) intervals allows floor(W / s) + 1 ≥ m + 1 of them once m − 1 ≥ s × m.
// One more for rounding. With min_spacing 1.0 there is no such m.
func spanLast(minSpacing float64) int {
	if minSpacing >= 1 {
		return maxSpanMarks
	}
	return min(int(math.Ceil(1/(1-minSpacing)))+1, maxSpanMarks)
}

// spanFirst is the fewest gaps, m, between two requests at interval iv
// that the span floor must keep apart: a window of W ≥ BatchWindow holding
// m + 1 requests keeps G1's bound floor(W × limit / min_spacing) + 1 as
// long as m ≤ BatchWindow / (min_spacing × iv), whatever their stamps.
func spanFirst(iv time.Duration, minSpacing float64) int {
	return int(float64(BatchWindow)/(minSpacing*float64(iv))) + 1
}

// The span floor: above SpacingMaxRate with slack 0, request j may not
// depart before stamped_{j−M} + M × min_spacing × iv, M = spanFirst(iv).
// With slack 0 consecutive departures keep min_spacing intervals (Next,
// floored), so departure j is then at least stamped_{j−m} + m ×
// min_spacing × iv for every m ≥ M, by induction on m: request j is
// stamped no earlier than its departure and request j − m no later than
// stamped_{j−m}, so any m ≥ M gaps span at least m × min_spacing
// intervals at the downstream, and a window W ≥ BatchWindow of any length
// holds at most floor(W × limit / min_spacing) + 1 requests (SPEC G1,
// windows of a length other than a whole number of intervals), while the
// tiles (Wire) keep those of a whole number. Above ~19,000/s at
// min_spacing 0.95 (M > spanLast) the tiles alone are enough. spanFloor is
// the floor of the next departure (WireFloor). Departures are marked at
// every rate with slack 0, so that the first ones after a change from
// under SpacingMaxRate to over it are held by the last ones before (a
// review helper found 3 requests in 1.557 ms after 900/s → 1,200/s, bound
// 2).
//
// Its cost: a late request's followers make its lateness up by
// 1 − min_spacing of an interval each, and a departure held later than the
// make-up's lag counts as late (TakeForgiven). At min_spacing 0.95 the
// property model lost 0.13 points more at 5,000/s (docs/performance.md,
// session 32). At min_spacing 1.0 nothing is made up, and every
// microsecond from departure to report holds the departures that follow:
// a review helper measured 1.2–1.4 % of the rate at 1,500–10,000/s for a
// constant 16 µs (what the HTTP sink's gate and write take at the median).
//
// A request whose write is held past maxWireWait (the loop then departs
// the next ones without its report) would reach the downstream among them
// and break a window, as it would the tiles: a gated lane departs it again
// before it is written (drain/gate.go, overtaken requests).
//
// Only a lane whose sink gates its writes holds its departures to it
// (drain.Lane.departureAt): the floor counts the whole delay from a
// departure to its wire report against the next ones, which at a gate is
// the gate's wake-up and the write (16 µs at the median at 5,000/s). A
// sink that does not gate reports after its task's start too: every
// request 199 µs from departure to report cut a 5,000/s lane to ~4,480/s
// (TestLaneExactWireReports). Such a lane keeps windows of other lengths
// at its departures (the spacing floor), not at the wire.
//
// Why: the tiles keep windows of a whole number of intervals, but a
// request written at the end of its tile and the next ones on time put 7
// requests in 1.007 ms at 5,000/s at the downstream (bound 6 for a window
// of 5.03 intervals; 6,000–10,000 such windows in 10 s through the HTTP
// sink, bench section 11, 2026-12-07; none with the floor). Lateness is
// still made up, by at most 1 − min_spacing of an interval a request, as
// up to SpacingMaxRate. Tests: TestPacerWireTilesHoldTheWindows
// (windows of other lengths), TestPacerWireFloor, TestPacerSpanFloorProperty,
// TestLaneGateHoldsTheSpanFloor, and bench section 11 at the downstream's
// kernel stamps (TestBenchSectionHTTP).
func (p *Pacer) spanFloor(iv time.Duration) time.Time {
	var at time.Time
	if !p.floored() || iv >= time.Second/SpacingMaxRate || len(p.spans) == 0 {
		return at
	}
	k := spanFirst(iv, p.minSpacing)
	n := len(p.spans) // the next departure's distance to spans[i] is n − i
	if k > spanLast(p.minSpacing) || k > n {
		return at
	}
	if m := p.spans[n-k]; !m.stamped.IsZero() {
		// Rounded up: a floor a nanosecond early is not a floor.
		at = m.stamped.Add(time.Duration(math.Ceil(p.minSpacing * float64(k) * float64(iv))))
	}
	return at
}

// markSpan records a departure at now (interval iv) in spans, keeping at
// least the latest the floor may need (spanLast; with min_spacing 1.0,
// spanFirst at iv, and no fewer than 64 for a faster rate to come), at
// most twice as many: the oldest are dropped in one copy every so many
// departures.
func (p *Pacer) markSpan(now time.Time, iv time.Duration) {
	keep := spanLast(p.minSpacing) + 1
	if p.minSpacing >= 1 {
		keep = min(max(spanFirst(iv, p.minSpacing)+1, 64), maxSpanMarks)
	}
	if len(p.spans) >= 2*keep { // shift once per keep departures
		p.spans = append(p.spans[:0], p.spans[len(p.spans)-keep+1:]...)
	}
	p.spans = append(p.spans, spanMark{departed: now})
}

// wireSpan records that the departure at departed was stamped by stamped.
func (p *Pacer) wireSpan(departed, stamped time.Time) {
	for i := len(p.spans) - 1; i >= 0; i-- {
		if p.spans[i].departed.Equal(departed) {
			p.spans[i].stamped = stamped
			return
		}
	}
}

// TakeForgiven returns the time the schedule has given up since the last
// call, and clears it, in two parts: late is the lateness of departures
// beyond what is made up (MakeUpLag: a waiter that woke, or a process that
// ran, later than that), wire the time late wire reports moved the
// schedule (Wire). Under a backlog the departures fall short of the limit
// by about (late + wire) × rate: it is where a lane's missing rate went
// (SPEC G1, shaper_departure_lateness_forgiven_seconds_total). Idle time,
// pauses and holds are not in it: they earn no credit by design (G2).
func (p *Pacer) TakeForgiven() (late, wire time.Duration) {
	late, wire = p.forgivenLate, p.forgivenWire
	p.forgivenLate, p.forgivenWire = 0, 0
	return late, wire
}

// Rebase makes the schedule continue one interval (at the rate in force at
// now) after the previous departure, with no lateness to make up and no
// slack credit. Use it when something else timed the departures — a shared
// schedule across replicas (SPEC §3 Global rate), whose slots make this
// pacer look late at every departure and hold credit it never used — and
// this pacer takes over (the switch to the Redis fallback earns no credit,
// SPEC G2), and not before what the wire reports asked for (Wire). Without a
// previous departure it does nothing.
func (p *Pacer) Rebase(now time.Time) {
	if p.last.IsZero() {
		return
	}
	p.tat = p.last.Add(p.interval(now) + p.credit())
	if p.tat.Before(p.wireLeast) {
		p.tat = p.wireLeast // see SetConfig
	}
}

// credit is the slack's burst tolerance as a duration: slack intervals of
// the limit (not of the warmup ramp, whose longer intervals would turn a
// cooling lane's slack into more departures).
func (p *Pacer) credit() time.Duration {
	return time.Duration(p.slack) * p.limit.Interval()
}
