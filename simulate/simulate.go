// Package simulate runs a lane's own rules on a virtual clock against an
// arrival trace, with no NATS and no sink (SPEC §5 shaper simulate): the
// same shaper.Pacer (rate, slack, min_spacing, warmup), shaper.Bucket
// (capacity, fairness, max_wait projection), overflow (block or reject),
// max_age (shaper.Expired), quota (shaper.Quota, with drain's gate: the
// pacer held while it waits, no burst after) and max_in_flight the daemon
// runs, driven by a small event loop instead of drain's goroutines and
// waiter.
//
// What the loop stands in for, and how (README, "Plan with shaper simulate"):
//   - the fetch: in block mode arrivals wait in the stream and enter the
//     bucket as soon as a slot is free (the daemon pulls in batches a few
//     milliseconds later); in reject mode they are admitted on arrival;
//   - the sink: every call takes Options.SinkLatency (0 by default) and
//     succeeds, so no retries;
//   - the precise waiter: a departure leaves exactly at the pacer's instant;
//   - the housekeeping sweep of max_age: every 250 ms, as drain's;
//   - the quota of one replica: a quota shared through Redis (rate.global)
//     is run as if this were the only replica.
//
// The daemon's drain.Lane cannot run on this clock: its loops sleep on real
// timers (testing/synctest, which fakes them, is for tests only). A test
// through the daemon keeps the two within one interval of each other.
package simulate

import (
	"cmp"
	"slices"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// Epoch is the virtual instant of offset 0 of a trace.
var Epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// sweepEvery is drain's housekeeping period (drain/keepalive.go).
const sweepEvery = 250 * time.Millisecond

// Arrival is one message of a trace: when it is published, as an offset
// from the start, and its fair-queueing key ("" without bucket.fair_key).
type Arrival struct {
	At  time.Duration
	Key string
}

// Options are the knobs of a run that are not in the lane's configuration.
type Options struct {
	// SinkLatency is how long each sink call takes (≥ 0); a task holds one
	// of task.max_in_flight slots for that long.
	SinkLatency time.Duration
}

// Departure is a message that left the bucket.
type Departure struct {
	At, Arrived time.Duration // departure and arrival offsets
	Key         string
}

// Wait is the queue wait of d, from its arrival (the stream's wait in
// block mode included) to its departure.
func (d Departure) Wait() time.Duration { return d.At - d.Arrived }

// DeadLetter is a message the lane dead-lettered, with its reason
// (shaper.ReasonOverflow, ReasonMaxWait, ReasonExpired).
type DeadLetter struct {
	At, Arrived time.Duration
	Key, Reason string
}

// Result is what a run produced, in time order.
type Result struct {
	Limit       float64 // rate.limit, messages per second
	Departures  []Departure
	DeadLetters []DeadLetter
	// Depth samples the bucket depth after every change, as (offset, depth).
	Depth []DepthSample
	// Arrivals is the trace that was run, sorted.
	Arrivals []Arrival
	// QuotaWaits are the waits for rate.quota, in time order: from when
	// the quota held the next departure until the instant it let it go
	// (shaper_lane_paused is 1 then in the daemon).
	QuotaWaits []Span
	// Quota is rate.quota (Count 0 = none).
	Quota config.Quota
}

// Span is an interval of the run, as offsets.
type Span struct{ From, Until time.Duration }

// DepthSample is the bucket depth from At on.
type DepthSample struct {
	At    time.Duration
	Depth int
}

// PacerConfig is the pacer's configuration of a lane, as drain builds it.
func PacerConfig(cfg config.Lane) shaper.PacerConfig {
	return shaper.PacerConfig{
		Limit:        cfg.Rate.Limit,
		Slack:        cfg.Rate.Slack,
		MinSpacing:   cfg.Rate.MinSpacing,
		WarmupPeriod: cfg.Rate.Warmup.Period,
		ColdFactor:   cfg.Rate.Warmup.ColdFactor,
	}
}

type held struct {
	arrival Arrival
	msg     *shaper.Message
}

// Run runs arrivals (sorted or not) through a lane configured as cfg, which
// must have passed config.Validate, until every message departed or was
// dead-lettered.
//
// It is long (about 150 lines) on purpose: it is the one event loop of the
// simulation, and the order in which the events of one instant are taken
// (arrivals, expiry, departures, finished calls) reads top to bottom, as in
// the daemon's departure loop it mirrors.
func Run(cfg config.Lane, arrivals []Arrival, opt Options) Result {
	arrivals = slices.Clone(arrivals)
	slices.SortStableFunc(arrivals, func(a, b Arrival) int { return cmp.Compare(a.At, b.At) })
	res := Result{Limit: float64(cfg.Rate.Limit), Arrivals: arrivals, Quota: cfg.Rate.Quota}
	at := func(d time.Duration) time.Time { return Epoch.Add(d) }
	off := func(t time.Time) time.Duration { return t.Sub(Epoch) }

	var keyOf func(*shaper.Message) string
	if cfg.Bucket.FairKey != "" {
		// The trace gives the key that bucket.fair_key would read.
		keyOf = func(m *shaper.Message) string { return m.Subject }
	}
	bucket := shaper.NewFairBucket(cfg.Bucket.Capacity, keyOf)
	pacer := shaper.NewPacer(PacerConfig(cfg), Epoch)
	quota := quotaGate{q: shaper.NewQuota(cfg.Rate.Quota.Count, cfg.Rate.Quota.Per, Epoch)}
	reject := cfg.Bucket.Overflow == config.OverflowReject
	maxAge := cfg.Bucket.MaxAge
	slots := max(1, cfg.Task.MaxInFlight)
	byMsg := map[*shaper.Message]Arrival{}

	var stream []*shaper.Message // block mode: published, not yet in the bucket
	var done []time.Duration     // completion offsets of tasks in flight (sorted)
	next := 0                    // next arrival
	now := Epoch
	var ready time.Time // since when a message and a slot were both ready (zero: not ready)
	nextSweep := Epoch.Add(sweepEvery)
	depth := -1
	sample := func() {
		if n := bucket.Len(); n != depth {
			depth = n
			res.Depth = append(res.Depth, DepthSample{off(now), n})
		}
	}
	dead := func(m *shaper.Message, reason string) {
		a := byMsg[m]
		delete(byMsg, m)
		res.DeadLetters = append(res.DeadLetters, DeadLetter{At: off(now), Arrived: a.At, Key: a.Key, Reason: reason})
	}
	expire := func(removed []*shaper.Message, empty bool) {
		for _, m := range removed {
			dead(m, shaper.ReasonExpired)
		}
		if len(removed) > 0 && empty {
			pacer.SetBusy(now, false)
		}
	}
	admit := func(m *shaper.Message, reserved bool) {
		// The projected wait as drain/fetch.go computes it.
		rate := pacer.RampRate(now)
		maxWait := cfg.Bucket.MaxWait
		if first := pacer.Next(now).Sub(now); maxWait > 0 && first > 0 {
			maxWait -= first
			if maxWait <= 0 {
				maxWait, rate = 1, 0
			}
		}
		wasEmpty, err := bucket.Admit(m, now, reserved, rate, maxWait)
		switch {
		case err == nil:
			if wasEmpty {
				pacer.SetBusy(now, true)
			}
		case err == shaper.ErrMaxWait:
			dead(m, shaper.ReasonMaxWait)
		default:
			dead(m, shaper.ReasonOverflow)
		}
	}
	fill := func() { // block mode: the fetch takes what fits
		for len(stream) > 0 && bucket.Reserve(1) == 1 {
			admit(stream[0], true)
			stream = stream[1:]
		}
	}

	for {
		// Tasks that finished by now free their slots.
		for len(done) > 0 && at(done[0]).Compare(now) <= 0 {
			done = done[1:]
		}
		// Arrivals up to now.
		for next < len(arrivals) && at(arrivals[next].At).Compare(now) <= 0 {
			a := arrivals[next]
			next++
			m := &shaper.Message{Subject: a.Key, Published: at(a.At), Received: at(a.At)}
			byMsg[m] = a
			if reject {
				admit(m, false)
			} else {
				stream = append(stream, m)
			}
		}
		if !reject {
			fill()
		}
		if !now.Before(nextSweep) {
			if maxAge > 0 {
				expire(bucket.RemoveIf(func(m *shaper.Message) bool { return shaper.Expired(m, now, maxAge) }))
			}
			nextSweep = nextSweep.Add(sweepEvery)
			if !reject {
				fill()
			}
		}
		// The departure loop (awaitHead, popDeliverable): expired heads go
		// without a departure, looked at while a task slot is free; while
		// every slot is held only the sweep finds them.
		if maxAge > 0 && len(done) < slots {
			expire(bucket.DropHeadWhile(func(m *shaper.Message) bool { return shaper.Expired(m, now, maxAge) }))
		}
		sample()
		canGo := bucket.Len() > 0 && len(done) < slots
		if !canGo {
			ready = time.Time{}
		} else if ready.IsZero() {
			ready = now
		}
		var wake time.Time
		if canGo {
			t := pacer.Next(now)
			if q, held := quota.until(pacer, now, t); held {
				if n := len(res.QuotaWaits); n == 0 || res.QuotaWaits[n-1].Until < off(now) {
					res.QuotaWaits = append(res.QuotaWaits, Span{From: off(now), Until: off(q)})
				}
				t = q
			}
			if t.After(now) {
				wake = t
			} else {
				m, empty := bucket.Pop()
				pacer.Depart(quota.ready(ready, now), now)
				quota.depart(pacer, now)
				if empty {
					pacer.SetBusy(now, false)
				}
				a := byMsg[m]
				delete(byMsg, m)
				res.Departures = append(res.Departures, Departure{At: off(now), Arrived: a.At, Key: a.Key})
				done = append(done, off(now)+max(0, opt.SinkLatency))
				slices.Sort(done)
				ready = time.Time{}
				sample()
				continue // the same instant may admit (block) or depart again
			}
		}
		// The next event.
		var events []time.Time
		if !wake.IsZero() {
			events = append(events, wake)
		}
		if next < len(arrivals) {
			events = append(events, at(arrivals[next].At))
		}
		if len(done) > 0 {
			events = append(events, at(done[0]))
		}
		if len(events) == 0 {
			// Nothing left to happen (with a valid config: nothing held).
			return res
		}
		if maxAge > 0 && (bucket.Len() > 0 || len(stream) > 0) {
			events = append(events, nextSweep)
		}
		now = slices.MinFunc(events, func(a, b time.Time) int { return a.Compare(b) })
	}
}

// quotaGate is drain's gate of the quota (drain/quota.go: quotaUntil,
// quotaReady, quotaDepart) on shaper.Quota, the daemon's quota: the quota
// holds the next departure only when it frees its slot after the pacer's
// time; while it holds, the pacer is held (it cools as if idle); and the
// departure that ends a wait counts as ready at the wait's end, so the wait
// is no lateness to make up (no burst, SPEC G2).
type quotaGate struct {
	q    *shaper.Quota
	held bool
	end  time.Time
}

func (g *quotaGate) until(p *shaper.Pacer, now, paced time.Time) (time.Time, bool) {
	at := g.q.Next(now)
	held := at.After(now) && at.After(paced)
	if held {
		g.end = at
	}
	if held != g.held {
		g.held = held
		p.Hold(now, held)
	}
	return at, held
}

func (g *quotaGate) ready(ready, now time.Time) time.Time {
	if !g.end.IsZero() && !g.end.After(now) && g.end.After(ready) {
		return g.end
	}
	return ready
}

func (g *quotaGate) depart(p *shaper.Pacer, now time.Time) {
	g.q.Depart(now)
	g.end = time.Time{}
	if g.held {
		g.held = false
		p.Hold(now, false)
	}
}
