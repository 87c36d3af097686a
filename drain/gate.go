package drain

import (
	"context"
	"sync"
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
