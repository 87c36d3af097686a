package drain

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// GlobalSchedule is the departure schedule a lane shares with the other
// replicas serving the same downstream (SPEC §3 "Global rate",
// docs/scaling.md). Implementation: redisslots.LaneSlots (Redis).
//
// Contract: the schedule is a GCRA over all replicas: slots are at least
// one emission interval apart, idle time earns no more than the request's
// slack, and a late request is made up by at most (1 − min_spacing)
// intervals (shaper.MakeUpLag's rule without the floor, which one replica
// cannot see across the others), and a pause set by any replica holds
// every replica's slots. Its methods may be called concurrently (Reserve by
// the departure loop, Pause by tasks) and must return within a bounded time
// (the store's timeout), also when ctx has no deadline.
type GlobalSchedule interface {
	// Reserve takes the next shared departure slot for one departure of
	// this lane and returns the local time at which it may leave. The time
	// may be in the past by up to shaper.SlotTolerance; a slot is used once
	// and never given back. A *QuotaWait error is the store's answer that
	// the shared quota (r.QuotaCount) is spent: no slot was taken. Any
	// other error means the shared store failed (unreachable, timeout):
	// the lane falls back to local pacing.
	Reserve(ctx context.Context, r SlotRequest) (time.Time, error)
	// Pause extends the shared pause of the lane until until (a 429/503
	// Retry-After seen by any replica pauses all of them): no replica gets
	// a slot before it.
	Pause(ctx context.Context, until time.Time) error
	// Probe asks the shared store whether it answers, without taking a
	// slot: a lane in fallback with nothing to depart uses it to clear
	// shaper_global_limiter_fallback as soon as the store is back (issue
	// 12). nil means it answered.
	Probe(ctx context.Context) error
}

// SlotRequest is one reservation on a GlobalSchedule.
type SlotRequest struct {
	// Interval is the lane's emission interval in force (warmup included).
	Interval time.Duration
	// Slack is the credit, in departures, that an idle schedule may grant
	// (rate.slack); 0 on the first reservations after the Redis fallback,
	// which earns no credit (SPEC G2).
	Slack int
	// MinSpacing is rate.min_spacing: a late request is made up by at most
	// (1 − MinSpacing) intervals, and a slot used later than
	// shaper.SlotTolerance after its time is dropped.
	MinSpacing float64
	// QuotaCount and QuotaPer are rate.quota, shared by the replicas (SPEC
	// §3 Quota: "shared through Redis like the rate"): no window of
	// QuotaPer holds more than QuotaCount slots of all replicas together.
	// QuotaCount 0 = no quota. When the quota is spent Reserve returns a
	// *QuotaWait.
	QuotaCount int
	QuotaPer   time.Duration
}

// QuotaWait is the error GlobalSchedule.Reserve returns when the shared
// quota (SlotRequest.QuotaCount) is spent: no slot was taken, and none is
// before Until (local time), when the oldest counted slot leaves the
// window. It is an answer of the store, not a failure: the lane waits for
// it as for its own quota (quota.go: shaper_lane_paused, no burst after).
type QuotaWait struct {
	Until time.Time
}

func (e *QuotaWait) Error() string {
	return "shared quota spent until " + e.Until.Format(time.RFC3339Nano)
}

// SlotReleaser is implemented by a GlobalSchedule that wants to know of a
// slot the lane dropped unused (a departure woken later than
// shaper.SlotTolerance after it): Release says so, best effort. The
// schedule makes up the lost slot as a lane's own pacer makes up a late
// departure (spacing the following slots closer, never in a burst, SPEC
// G1), and a shared quota takes back the slot's count. Its time is never
// given back as a burst.
type SlotReleaser interface {
	Release(ctx context.Context, slot time.Time, r SlotRequest) error
}

// DropNotifier is implemented by a GlobalSchedule that drops slots of its
// own (the unused slots of a lease that came too late for them): OnDrop
// gives it the function to call with the number of slots it dropped each
// time, for shaper_global_slots_dropped_total. The held slots the lane
// drops it counts itself. OnDrop is called once, before the lane starts; f
// must be cheap (it may be called under the schedule's lock).
type DropNotifier interface {
	OnDrop(f func(n int))
}

// ScheduleShifter is implemented by a GlobalSchedule that can move the
// slots it has not granted yet later: Shift says that the request of the
// slot at slot (local time) reached the wire by later than the schedule
// allows, best effort. The lane calls it from the sink's report of the
// write (WireReporter), so that a request that left late — a new
// connection's dial, a write descheduled for milliseconds — cannot bring a
// whole second of the other replicas' slots into one window of the
// downstream with it (SPEC G1: the bounds hold for what reaches the
// downstream; docs/scaling.md, "Late writes"). It costs rate, never a
// burst.
type ScheduleShifter interface {
	Shift(ctx context.Context, slot time.Time, by time.Duration) error
}

// SlotPrefetcher is implemented by a GlobalSchedule that reserves slots
// ahead of need (redisslots: the next lease, in the background). The
// departure loop calls PrefetchSlots after each departure, off the
// departure's path: starting the reservation costs the caller a goroutine's
// start, and on a VM whose idle cores wake slowly that start is 7–220 µs
// (median ~30 µs; TestRedisLastSlotNotStale) — made as the slot was handed
// out, it made departures late past the slot's tolerance (60 µs at
// 2,500/s) and dropped them. ctx bounds nothing the reservation needs (its
// own timeout does); it carries values only.
type SlotPrefetcher interface {
	PrefetchSlots(ctx context.Context)
}

// QuotaReporter is implemented by a GlobalSchedule that knows what the
// shared quota allows: QuotaRemaining returns the messages the quota
// allowed in the window at its last answer, or -1 when it has not
// answered with a quota yet. Status shows it instead of the replica's own
// count.
type QuotaReporter interface {
	QuotaRemaining() int
}

// WithGlobal makes the lane take every departure's time from g as well as
// from its own pacer (rate.global). While g fails, the lane paces locally
// at limit / replicasHint (never the full limit), sets
// shaper_global_limiter_fallback to 1, logs the transition once, asks g
// again every globalProbeEvery and returns to it when it answers. A quota
// (rate.quota) is shared through g too; in the fallback each replica keeps
// count / replicasHint of it (quota.go).
func WithGlobal(g GlobalSchedule, replicasHint int) Option {
	return optionFunc(func(l *Lane) {
		if g != nil {
			l.global = &globalState{g: g, hint: max(1, replicasHint)}
			l.global.prefetch, _ = g.(SlotPrefetcher) // once, not per departure
		}
	})
}

// globalProbeEvery is how often a lane in fallback asks the shared schedule
// again (at a departure, not on every one).
const globalProbeEvery = time.Second

// globalReturnGrace is how long a lane back on the shared schedule keeps
// its local pacer at limit / replicas_hint. Other replicas may still pace
// locally for up to a probe interval after the store is back (plus up to a
// second of go-redis's dial back-off), outside the shared schedule; were
// this one to take the whole limit from the schedule meanwhile, the
// downstream would see more than the limit.
const globalReturnGrace = 2 * globalProbeEvery

// globalPauseTimeout bounds the best-effort propagation of a pause.
const globalPauseTimeout = time.Second

// globalState is the departure loop's view of the shared schedule; only
// that goroutine touches it (Pause reads g alone).
type globalState struct {
	g        GlobalSchedule
	prefetch SlotPrefetcher // g's, when it reserves ahead; nil otherwise
	hint     int

	held time.Time // slot reserved and not yet used; zero = none
	// wireSlot is the slot of the message whose request is not yet on the
	// wire (Lane.unwired), and wireLow the least delay from departure to
	// the wire lately (lateWrite); both under Lane.mu. shifting is set
	// while a Shift is under way (one at a time).
	wireSlot  time.Time
	wireLow   time.Duration
	shifting  atomic.Bool
	fallback  bool      // the store failed: local pacing only
	nextProbe time.Time // in fallback: when to ask the store again
	reduced   bool      // the local pacer runs at limit / hint
	// reducedNow mirrors reduced for Update, which runs on another goroutine.
	reducedNow atomic.Bool
	fullAt     time.Time // back on the schedule: when the full limit returns
	// noCredit is set while the lane comes back from the fallback: its
	// reservations ask for no slack, so the schedule, idle while this
	// replica paced alone, grants none (SPEC G2).
	noCredit bool

	// fallbackNow mirrors fallback for the house loop (probeIdle), and
	// probedBack says the house loop saw the store answer during this
	// fallback; houseProbeAt is the house loop's own.
	fallbackNow, probedBack atomic.Bool
	houseProbeAt            time.Time
}

// globalAt is step 3 of departLoop for a global lane, called once the local
// pacer lets a departure leave at now. It returns when the departure may
// leave: the slot held or newly reserved, or, in fallback, the local
// pacer's time; and after, the clock once a store call failed (now when
// the store was not asked or answered). ok is false when ctx ended (the loop must stop).
func (l *Lane) globalAt(ctx context.Context, now time.Time) (at, after time.Time, ok bool) {
	g := l.global
	l.mu.Lock()
	rate := l.pacer.RampRate(now)
	l.mu.Unlock()
	if g.reduced {
		rate *= float64(g.hint) // the shared schedule runs at the full limit
	}
	cfg := l.conf()
	req := SlotRequest{Interval: shaper.Limit(rate).Interval(), Slack: cfg.Rate.Slack, MinSpacing: cfg.Rate.MinSpacing,
		QuotaCount: cfg.Rate.Quota.Count, QuotaPer: cfg.Rate.Quota.Per}
	if g.fallback || g.noCredit {
		req.Slack = 0 // the probe that finds the store back, and the grace
	}
	if !g.held.IsZero() {
		if now.Sub(g.held) <= shaper.SlotTolerance(req.Interval, req.Slack, req.MinSpacing) {
			return g.held, now, true
		}
		if rel, ok := g.g.(SlotReleaser); ok {
			// Not used: it is made up by the schedule when it was only a
			// little late, and must not spend the shared quota (quota.go).
			if err := rel.Release(ctx, g.held, req); err != nil {
				l.log.Debug("dropped slot not released from the shared quota", "err", err)
			}
		}
		l.m.SlotsDropped.Inc()
		g.held = time.Time{} // too late for it (a late wake, a pause, a slow wire): not used
	}
	if g.fallback && now.Before(g.nextProbe) {
		return now, now, true
	}
	slot, err := g.g.Reserve(ctx, req)
	var spent *QuotaWait
	if errors.As(err, &spent) {
		err = nil // the store answered: the shared quota is spent
	}
	if err != nil {
		// A failed call may have taken the store's timeout: what follows
		// happens after it (a departure stamped with the instant before a
		// 300 ms timeout let the next one follow at once, found by
		// review). An answer keeps the instant the slot was asked at, as
		// the shared schedule and its quota count it.
		now = time.Now()
		if ctx.Err() != nil {
			return now, now, false
		}
		g.nextProbe = now.Add(globalProbeEvery)
		if g.fallback {
			l.m.Fallback.Set(1) // the house loop may have seen it answer meanwhile
			return now, now, true
		}
		g.fallback = true
		g.probedBack.Store(false)
		g.fallbackNow.Store(true)
		l.setReduced(true, now)
		l.mu.Lock()
		at = l.pacer.Next(now) // the reduced rate from this departure on
		l.mu.Unlock()
		l.m.Fallback.Set(1)
		l.log.Warn("global rate unavailable: pacing locally at limit / replicas_hint",
			"limit", (l.conf().Rate.Limit / shaper.Limit(g.hint)).String(), "replicas_hint", g.hint, "err", err)
		return at, now, true
	}
	if g.fallback {
		g.fallback = false
		g.fallbackNow.Store(false)
		g.noCredit = true
		g.fullAt = now.Add(globalReturnGrace)
		l.m.Fallback.Set(0)
		l.log.Info("global rate restored: pacing by the shared schedule", "limit", l.conf().Rate.Limit.String(),
			"full_limit_in", globalReturnGrace)
	}
	if g.reduced && !now.Before(g.fullAt) {
		l.setReduced(false, now)
		g.noCredit = false
	}
	if spent != nil {
		return l.sharedQuotaWait(spent.Until, now), now, true // quota.go
	}
	g.held = slot
	return slot, now, true
}

// setReduced sets the local pacer's limit to limit / replicas_hint (the
// fallback) or back to the limit.
func (l *Lane) setReduced(reduced bool, now time.Time) {
	l.global.reduced = reduced
	l.global.reducedNow.Store(reduced)
	cfg := pacerConfig(*l.conf())
	if reduced {
		cfg.Limit /= shaper.Limit(l.global.hint)
	}
	l.mu.Lock()
	l.pacer.SetConfig(cfg, now)
	l.setQuota(*l.conf(), now) // count / replicas_hint in the fallback (quota.go)
	if reduced {
		// The shared slots timed the departures so far; from the last one
		// on, the local pacer alone keeps the reduced rate, with no credit
		// for the lateness those slots made it see.
		l.pacer.Rebase(now)
	}
	l.m.RateLimit.Set(l.pacer.Rate(now))
	l.mu.Unlock()
}

// prefetchSlots lets the shared schedule reserve ahead after a departure
// (SlotPrefetcher); nothing in the fallback, whose departures took no slot.
func (l *Lane) prefetchSlots(ctx context.Context) {
	if g := l.global; g != nil && g.prefetch != nil && !g.fallback {
		g.prefetch.PrefetchSlots(ctx)
	}
}

// pauseGlobal propagates a pause to the other replicas, best effort: when
// the shared store fails, this replica's pause still holds.
func (l *Lane) pauseGlobal(until time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), globalPauseTimeout)
	defer cancel()
	if err := l.global.g.Pause(ctx, until); err != nil {
		l.log.Debug("shared pause not propagated", "until", until.Format(time.RFC3339Nano), "err", err)
	}
}

// probeIdle runs on the house loop's tick: while the lane is in fallback and
// has nothing to depart (so no departure asks the store), it probes the
// shared store every globalProbeEvery and sets shaper_global_limiter_fallback
// from the answer, so the gauge returns to 0 when Redis answers again even
// with no departures (it stayed at 1, issue 12). The lane rejoins the shared
// schedule at its next departure, which asks the store itself (globalAt).
func (l *Lane) probeIdle(now time.Time) {
	g := l.global
	if g == nil || !g.fallbackNow.Load() || l.bucket.Len() > 0 || now.Before(g.houseProbeAt) {
		return
	}
	g.houseProbeAt = now.Add(globalProbeEvery)
	ctx, cancel := context.WithTimeout(context.Background(), globalPauseTimeout)
	err := g.g.Probe(ctx)
	cancel()
	if err != nil {
		l.m.Fallback.Set(1)
		return
	}
	l.m.Fallback.Set(0)
	if !g.probedBack.Swap(true) {
		l.log.Info("redis answers again: the lane, idle, takes its next departure from the shared schedule")
	}
}

// lateWrite is the delay by which the shared schedule must move when m's
// request, which departed at departed in the slot at slot, reached the
// wire at t; 0 when none. l.mu is held.
//
// The request's lateness is its delay from the slot to the wire beyond the
// least departure-to-wire delay lately (wireLow: what every request pays,
// and so every replica's). The schedule leaves room for part of it: its
// make-up of dropped slots (shaper.MakeUpLag) keeps 151 slots at 150/s more
// than a second apart by iv − MakeUpLag, half of which is allowed to a late
// write. A write later than that moves the slots not granted yet by the
// excess; then the late request and the slots after it keep every whole
// second of the downstream at W × limit + 1 (docs/scaling.md, "Late
// writes").
func (l *Lane) lateWrite(slot, departed, t time.Time) time.Duration {
	g := l.global
	if slot.IsZero() || g.fallbackNow.Load() {
		return 0
	}
	d := max(0, t.Sub(departed))
	low := g.wireLow
	if low == 0 || d <= low {
		low, g.wireLow = d, d
	} else {
		g.wireLow += wireLowRise // the write path got slower: follow it, slowly
	}
	rate := l.pacer.Rate(t)
	cfg := l.conf()
	if rate <= 0 || cfg.Rate.Quota.Count > 0 {
		// Not under a shared quota, as the schedule makes up no dropped
		// slot there either: its grants replay each window, and a slot
		// moved into the next one came back as more waits for the quota
		// (TestGlobalQuotaTwoReplicas: 9 waits a replica instead of 4).
		return 0
	}
	iv := shaper.Limit(rate).Interval()
	allow := (iv - shaper.MakeUpLag(iv, cfg.Rate.Slack, cfg.Rate.MinSpacing)) / 2
	return t.Sub(slot) - low - allow
}

// wireLowRise is how fast the least departure-to-wire delay follows a
// write path that got slower: per request.
const wireLowRise = time.Microsecond

// shiftSchedule moves the shared schedule's slots not granted yet later by
// by (ScheduleShifter), in the background and one call at a time; a late
// write seen while one is under way is covered by it or lost (best effort:
// it costs the rate, and a lost one the window it protected).
func (l *Lane) shiftSchedule(slot time.Time, by time.Duration) {
	sh, ok := l.global.g.(ScheduleShifter)
	if !ok || !l.global.shifting.CompareAndSwap(false, true) {
		return
	}
	l.tasks.Add(1)
	go func() {
		defer l.tasks.Done()
		defer l.global.shifting.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), globalPauseTimeout)
		defer cancel()
		if err := sh.Shift(ctx, slot, by); err != nil {
			l.log.Debug("shared schedule not moved after a late write", "by", by, "err", err)
			return
		}
		l.m.ScheduleDelayed.Add(by.Seconds())
	}()
}
