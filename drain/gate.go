package drain

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// The write gate: above SpacingMaxRate, a lane whose sink holds each
// request's first write until its departure instant (WireGater) releases
// the task a little before that instant, its lead, and counts the
// departure at the instant itself. The request travels from the departure
// loop to the connection (a task goroutine, the client, the connection's
// writer) during the lead and waits at the gate; the gate opens at the
// departure instant, on a precise waiter, and the request is written.
//
// Why: at 5,000/s an interval is 200 µs, and that path took 40–60 µs at
// the median and 150–220 µs at the 99th percentile here. Counted from the
// departure, every request pays it, and one slower than the interval
// moves the schedule (Pacer.Wire, the tiles) for good. Counted from the
// gate, only what the gate's wake-up and the write take is left (17–23 µs
// at the median), and a request that was slow on its way is late only by
// what it used beyond the lead. Measured in bench section 11 on this
// 2-core VM (docs/performance.md, session 30).
//
// The rules of SPEC G1 are unchanged: the pacer sees the departure at the
// gate's instant, and the downstream cannot see the request before it
// (the sink's promise, WireGater), so every proof that counts from the
// departure (the tiles of Pacer.Wire, the windows) counts from the gate.

// gateLeadMax is the longest lead: the path's 90th percentile here was
// 100–150 µs, and a lead longer than the path only lengthens the wait at
// the gate.
const gateLeadMax = 150 * time.Microsecond

// gateLeadShare is the lead's largest share of an interval. The lead must
// stay under one interval (less the write and its report): the departure
// loop holds the next departure until the previous request's write is
// reported (WireReporter), and a lead of a whole interval would hold each
// departure behind the previous one's gate.
const gateLeadShare = 0.75

// gateEarlyRelease: a gated departure whose release is less than this
// away leaves at once, up to this much before its lead, and its task waits
// the difference at the gate. The loop comes back to it on the previous
// request's wire report, 20–40 µs after that request's instant at 5,000/s,
// when its release is 50 µs after it: the rest was too short for a timer
// and the precise waiter spun it, ~6 % of a core at 5,000/s
// (go tool pprof -tagfocus sender=lane-http -peek 'drain.spinUntil$' on
// bench section 11's profile; docs/performance.md, session 32). At the
// gate the same wait is long enough for the waiter's timer. The lead then
// reaches up to gateLeadMax + gateEarlyRelease, which may exceed an
// interval: harmless, as the loop releases a departure only after the
// previous request's write was reported (see gateLeadShare).
const gateEarlyRelease = 50 * time.Microsecond

// gateLead is how long before its departure instant the loop releases a
// departure at the interval iv, for a lane whose writes are gated
// (Lane.gatesWire: not on the shared schedule, where a slot is used when
// the departure leaves, nor off the real clock): 0 up to SpacingMaxRate,
// where the spacing floor is anchored at the wire by each report and the
// path is a small share of the interval.
func gateLead(iv time.Duration) time.Duration {
	if iv <= 0 || iv >= time.Second/shaper.SpacingMaxRate {
		return 0
	}
	return min(time.Duration(gateLeadShare*float64(iv)), gateLeadMax)
}

// writeGate is the lane's gate (shaper.WithGate): one precise waiter for
// every request of the lane, taken in turn. The departure loop holds each
// departure until the previous request's write (WireReporter), so the
// requests reach the gate one at a time but for one held past maxWireWait.
type writeGate struct {
	mu sync.Mutex
	w  Waiter
}

// wait blocks until at (a departure instant, or later for min spacing at
// the wire: Lane.gateAt): at once when it has passed, or when ctx (the
// task's) ends during a wait longer than the longest lead.
func (g *writeGate) wait(ctx context.Context, at time.Time) {
	now := time.Now()
	if !now.Before(at) {
		return
	}
	if at.Sub(now) <= gateLeadMax+gateEarlyRelease {
		// Within the lead: only a timer. A ctx would start the waiter's
		// watcher goroutine anew for every request at 5,000/s.
		ctx = context.Background()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w == nil {
		g.w = NewPreciseWaiter()
	}
	_, _ = g.w.Wait(ctx, at, nil)
}

// close releases the waiter's timerfd (after the last task).
func (g *writeGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w != nil {
		g.w.Unbind()
		g.w = nil
	}
}

// Overtaken requests. The departure loop waits for each request's write
// (WireReporter) for at most maxWireWait, then departs the next ones: a dial
// or a TLS handshake that hangs must not hold the lane (G5). The request it
// gave up on is overtaken. Written when its connection finally came, it
// would reach the downstream among later requests, one more than G1 allows
// in their windows, or closer than min_spacing to one of them: its own
// departure instant long past, its gate would have nothing to hold. So a
// gated lane marks it when the next one leaves (overtake), and at its gate
// it waits for a departure of its own (redepart, which the loop serves
// before the bucket's head), and is written at that instant. The same holds
// for a request that yields (shaper.Gate.Yield): the HTTP sink's request
// that waits for an OAuth2 token (sinks/auth.go), or that is sent a second
// time on a fresh connection. The slot it departed in stays unused: G1
// keeps holding at the downstream, and the lane gives up one departure for
// each (shaper_departures_overtaken_total). Found by the review of the span
// floor (docs/performance.md, sessions 32–33); TestLaneOvertakenRequestDepartsAgain.
//
// When the task's context ends first (its timeout, a stop), the gate
// returns and the sink does not write (shaper.Gate). A drain's departure
// loop ends after the bucket emptied and the last task ended; when it has
// ended before (the drain's time ran out, a stop), the request takes the
// pacer's next time itself, on a waiter of its own.

// taskGate is a task's shaper.Gate: the lane, the task's message and its
// context.
type taskGate struct {
	l     *Lane
	m     *shaper.Message
	ctx   context.Context
	early bool // the task started before its departure instant
	// held is how long its gate held the write for min spacing at the
	// wire (Lane.gateAt), for its report (Lane.wired); l.mu.
	held time.Duration
}

// Wait returns at the departure instant of g's request (openGate).
func (g *taskGate) Wait() { g.l.openGate(g) }

// Yield lets the next departures go without the request's write, and makes
// its next Wait wait for a departure of its own.
func (g *taskGate) Yield() { g.l.yieldWire(g.m) }

// Early reports whether the task was released before its departure.
func (g *taskGate) Early() bool { return g.early }

// redeparture is an overtaken request waiting at its gate.
type redeparture struct {
	m     *shaper.Message
	ready chan struct{} // closed when the loop departed it again (m.Departed is the new instant)
	taken bool          // the loop departed it; l.mu
}

// overtakes is a gated lane's state for overtaken requests.
type overtakes struct {
	set   map[*shaper.Message]struct{} // overtaken, their gate not reached; l.mu
	queue []*redeparture               // at their gate, in admission order; l.mu
	n     atomic.Int32                 // len(queue): the loop looks without l.mu
	wake  chan struct{}                // a request joined the queue
	// taskEnded: a task ended (a drain's departure loop, with the bucket
	// empty, ends after the last task: until then one may be overtaken).
	taskEnded chan struct{}
}

// overtake marks u, a departed request whose write was not reported, when
// the next one leaves or when it yields (l.mu held; a gated lane).
func (l *Lane) overtake(u *shaper.Message) {
	if l.ot.set == nil {
		l.ot.set = make(map[*shaper.Message]struct{})
	}
	l.ot.set[u] = struct{}{}
}

// yieldWire is shaper.Gate.Yield for m's task.
func (l *Lane) yieldWire(m *shaper.Message) {
	l.mu.Lock()
	if l.unwired == m {
		l.unwired = nil // the next departure does not wait for m's write
	}
	l.overtake(m)
	l.mu.Unlock()
	notify(l.wake)
}

// openGate is g's Wait (shaper.Gate): it returns at the departure instant
// of its task's message, or, when that was overtaken, at the instant of a
// departure of its own; at once when the task's context ends.
func (l *Lane) openGate(g *taskGate) {
	ctx, m := g.ctx, g.m
	now := time.Now()
	l.mu.Lock()
	if _, over := l.ot.set[m]; !over {
		at := l.gateAt(g, now)
		start := now // when its write starts
		if at.After(start) {
			start = at
		}
		if l.unwired == m && start.After(l.departedAt) {
			// The loop waits for its write anew, so that the next one
			// cannot leave while it is being written (popDeliverable
			// looks again under l.mu).
			l.departedAt = start
		}
		l.mu.Unlock()
		l.gate.wait(ctx, at)
		return
	}
	delete(l.ot.set, m)
	r := &redeparture{m: m, ready: make(chan struct{})}
	// In admission order (G3), whatever the order of the gates: the
	// requests that waited for one token come to theirs together.
	i := len(l.ot.queue)
	for i > 0 && l.ot.queue[i-1].m.Admitted.After(m.Admitted) {
		i--
	}
	l.ot.queue = slices.Insert(l.ot.queue, i, r)
	l.ot.n.Add(1)
	l.mu.Unlock()
	notify(l.ot.wake)
	select {
	case <-r.ready:
	case <-ctx.Done():
	case <-l.departDone:
	}
	l.mu.Lock()
	if r.taken {
		at := l.gateAt(g, time.Now())
		l.mu.Unlock()
		l.gate.wait(ctx, at)
		return
	}
	l.ot.n.Add(-1) // it leaves the queue: its message is not kept (G6)
	if i := slices.Index(l.ot.queue, r); i >= 0 {
		l.ot.queue = slices.Delete(l.ot.queue, i, i+1)
	}
	if ctx.Err() != nil {
		l.mu.Unlock()
		notify(l.wake) // a loop held in redepart looks again (a drain may end)
		return
	}
	// The loop ended: the pacer's next time (a pause's end included),
	// after the write of the request before it, for which the loop would
	// have waited (wireHold): two requests overtaken before the loop ended
	// come here together, and the second one's spacing counts from the
	// first one's report (gateAt; found by review).
	for l.unwired != nil && l.unwired != m && time.Now().Before(l.departedAt.Add(maxWireWait)) {
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-l.wake: // a wire report (Lane.wired)
		case <-time.After(time.Millisecond): // another such request took the token
		}
		l.mu.Lock()
	}
	now = time.Now()
	at := l.pacer.Next(now)
	if f := l.pacer.WireFloor(now); f.After(at) {
		at = f
	}
	prev := l.recordDeparture(m, at, at)
	at = l.gateAt(g, now)
	l.mu.Unlock()
	l.m.Overtaken.Inc()
	l.countDeparture(m, prev, m.Departed, m.Departed)
	w := NewPreciseWaiter() // not the lane's: its gate may hold a task with an earlier instant
	_, _ = w.Wait(ctx, at, nil)
	w.Unbind()
}

// gateAt is when g opens, its task at the gate at now: the departure
// instant of its message, or later, min_spacing intervals after the
// previous request's wire report (shaper.Pacer.WireSpacing: SPEC G1's
// spacing at the downstream, up to SpacingMaxRate). A hold past when the
// write could have begun is kept in g for the report (wired), which counts
// the request as having departed that much later (shaper.Pacer.WireHeld).
// l.mu held.
func (l *Lane) gateAt(g *taskGate, now time.Time) time.Time {
	g.held = 0
	at := g.m.Departed
	s := l.pacer.WireSpacing(now)
	if !s.After(at) {
		return at
	}
	could := at // when the write could have begun
	if now.After(could) {
		could = now
	}
	// At most maxWireWait: a request that departed at a higher rate
	// than the one in force at its gate (a reload, the adaptive rate,
	// while it dialled) keeps the spacing of the rate it departed at
	// (SPEC G1 holds at the rate in force), not 9.5 s after a change
	// from 1,000/s to 0.1/s (found by review).
	if most := could.Add(maxWireWait); s.After(most) {
		s = most
	}
	g.held = max(0, s.Sub(could))
	return s
}

// redepart departs the first overtaken request waiting at its gate, at the
// pacer's next time (the loop serves these before the bucket's head: they
// were admitted before it). It returns as nextDeparture does, with no
// message: the request's task is running.
func (l *Lane) redepart(ctx context.Context) (*shaper.Message, time.Time, bool) {
	ready, now, scheduled, gone, ok := l.awaitDepartureTime(ctx, time.Time{})
	if !ok {
		return nil, time.Time{}, false
	}
	if gone { // woken with the bucket empty: look again (the request may have gone)
		return nil, now, true
	}
	l.mu.Lock()
	// None left (its task ended meanwhile), or a write began after the
	// loop's look: look again.
	if len(l.ot.queue) == 0 || l.wireHeldAt(now) {
		l.mu.Unlock()
		return nil, now, true
	}
	r := l.ot.queue[0]
	l.ot.queue[0] = nil
	l.ot.queue = l.ot.queue[1:]
	l.ot.n.Add(-1)
	r.taken = true
	prev := l.recordDeparture(r.m, ready, now)
	l.mu.Unlock()
	close(r.ready)
	l.m.Overtaken.Inc()
	l.countDeparture(r.m, prev, now, scheduled)
	return nil, now, true
}

// recordDeparture records m's departure at now (ready: when the loop was
// ready) in the pacer, the quota, the breaker and the wait for its write,
// and returns the previous departure's time (l.mu held). depart adds a
// message from the bucket to the tasks in flight; an overtaken request
// departing again (redepart, openGate) keeps its task's place.
func (l *Lane) recordDeparture(m *shaper.Message, ready, now time.Time) (prev time.Time) {
	prev = l.lastDeparture
	l.lastDeparture = now
	l.pacer.Depart(l.quotaReady(ready, now), now)
	l.countForgiven()
	l.quotaDepart(now)
	l.breakerDeparts(m, now)
	m.Departed = now
	l.wireDeparts(m, now)
	return prev
}

// countDeparture counts m's departure at now (due at scheduled; prev the
// one before) in the departure metrics and the recent rate.
func (l *Lane) countDeparture(m *shaper.Message, prev, now, scheduled time.Time) {
	l.m.Departures.Inc()
	l.m.Lateness.Observe(max(0, now.Sub(scheduled)).Seconds())
	if !prev.IsZero() {
		l.m.Gap.Observe(now.Sub(prev).Seconds())
	}
	l.recent.depart(now, now.Sub(m.Admitted))
}
