package drain

import (
	"context"
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

// wait blocks until at (a departure instant): at once when it has passed.
func (g *writeGate) wait(at time.Time) {
	if !time.Now().Before(at) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w == nil {
		g.w = NewPreciseWaiter()
	}
	_, _ = g.w.Wait(context.Background(), at, nil) // no ctx, no wake: only a timer, at most the lead
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
// in their windows: its own departure instant long past, its gate would
// have nothing to hold. So a gated lane marks it when the next one leaves
// (overtake), and at its gate it waits for a departure of its own
// (redepart, the first the loop serves), and is written at that instant.
// The slot it departed in stays unused: G1 keeps holding at the downstream,
// and the lane gives up one departure for each (shaper_departures_overtaken_total).
// Found by a review of the span floor (docs/performance.md, session 32);
// TestLaneOvertakenRequestDepartsAgain.
//
// When the task's timeout ends the wait first, the gate returns and the
// sink's write fails on the ended context (its deadline is the connection's,
// direct.go; the transport closes the connection). When the departure loop
// has ended (a drain emptied the bucket, a stop), the request takes the
// pacer's next time itself.

// redeparture is an overtaken request waiting at its gate.
type redeparture struct {
	m     *shaper.Message
	ready chan struct{} // closed when the loop departed it again (m.Departed is the new instant)
	taken bool          // the loop departed it; l.mu
	gone  bool          // its task stopped waiting; l.mu
}

// overtakes is a gated lane's state for overtaken requests.
type overtakes struct {
	set   map[*shaper.Message]struct{} // overtaken, their gate not reached; l.mu
	queue []*redeparture               // at their gate, in order; l.mu
	n     atomic.Int32                 // len(queue): the loop looks without l.mu
	wake  chan struct{}                // a request joined the queue
	// lead: the lane releases departures a lead early (above 1,000/s),
	// and every task gets the gate, also one whose worker started after
	// its instant: the gate is where an overtaken request is held.
	lead atomic.Bool
}

// overtake marks u, the previous departure whose write was not reported,
// when the next one leaves (l.mu held; a gated lane).
func (l *Lane) overtake(u *shaper.Message) {
	if l.ot.set == nil {
		l.ot.set = make(map[*shaper.Message]struct{})
	}
	l.ot.set[u] = struct{}{}
}

// openGate is the gate of m's task (shaper.WithGate): it returns at m's
// departure instant, or, when m was overtaken, at the instant of a
// departure of its own; ctx is the task's.
func (l *Lane) openGate(ctx context.Context, m *shaper.Message) {
	now := time.Now()
	l.mu.Lock()
	if _, over := l.ot.set[m]; !over {
		if l.unwired == m && now.After(l.departedAt) {
			// Its write starts now: the loop waits for it anew, so that
			// the next one cannot leave while it is being written.
			l.departedAt = now
		}
		at := m.Departed
		l.mu.Unlock()
		l.gate.wait(at)
		return
	}
	delete(l.ot.set, m)
	r := &redeparture{m: m, ready: make(chan struct{})}
	l.ot.queue = append(l.ot.queue, r)
	l.ot.n.Add(1)
	l.mu.Unlock()
	l.m.Overtaken.Inc()
	notify(l.ot.wake)
	select {
	case <-r.ready:
	case <-ctx.Done():
	case <-l.departDone:
	}
	l.mu.Lock()
	if !r.taken {
		r.gone = true
		if ctx.Err() == nil { // the loop ended: the pacer's next time
			now = time.Now()
			at := l.pacer.Next(now)
			if f := l.pacer.WireFloor(now); f.After(at) {
				at = f
			}
			l.pacer.Depart(at, at)
			m.Departed = at
			l.m.Departures.Inc()
		}
	}
	at := m.Departed
	l.mu.Unlock()
	l.gate.wait(at)
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
	if gone { // the bucket is empty: look again
		return nil, now, true
	}
	l.mu.Lock()
	var r *redeparture
	for r == nil && len(l.ot.queue) > 0 {
		r = l.ot.queue[0]
		l.ot.queue[0] = nil
		l.ot.queue = l.ot.queue[1:]
		l.ot.n.Add(-1)
		if r.gone {
			r = nil
		}
	}
	if r == nil {
		l.mu.Unlock()
		return nil, now, true
	}
	r.taken = true
	prev := l.lastDeparture
	l.lastDeparture = now
	l.pacer.Depart(l.quotaReady(ready, now), now)
	l.countForgiven()
	l.quotaDepart(now)
	l.breakerDeparts(r.m, now)
	r.m.Departed = now
	l.wireDeparts(r.m, now)
	l.mu.Unlock()
	close(r.ready)
	l.m.Departures.Inc()
	l.m.Lateness.Observe(max(0, now.Sub(scheduled)).Seconds())
	if !prev.IsZero() {
		l.m.Gap.Observe(now.Sub(prev).Seconds())
	}
	l.recent.depart(now, now.Sub(r.m.Admitted))
	return nil, now, true
}
