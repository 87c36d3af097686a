package drain

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// The departure loop runs a short task itself (issue 15, CPU per message).
//
// Handing every departure to a worker goroutine woke a second thread per
// message (the runtime's wakep: a futex wake, the other thread's search for
// work and its sleep again): 3.7 context switches per message at 1,000/s on
// the in-memory source, 1.3 with the task run by the goroutine that waited
// for its departure, and 14 µs of the lane's 74 µs per message
// (docs/performance.md, "Session 23").
//
// The rule it must keep is G5: a slow task never delays the next
// departure. So the loop runs on a pair of goroutines, the leader/followers
// pattern. The leader waits for the departure and, when the task is
// expected to end well before the next departure can be due, runs it in
// line; before that, it arms the alarm of the other goroutine, the
// follower, for followerLead before that next departure. A task that ends
// in time disarms the alarm: nobody wakes (a timerfd disarmed before its
// expiry, wait_linux.go), and the leader goes on. A task that outlasts its
// turn lets the alarm go off: the follower takes the lead and waits for the
// next departure, and the old leader, when its task ends, becomes the
// follower. One atomic word per follower (state) decides who leads when
// the alarm and the end of the task meet.
//
// Not in line: a lane whose waiter is not on the real clock (TimerWaiter,
// synctest's fake clock; no alarm), a lane on the shared schedule
// (rate.global: the slot prefetch after a departure must not wait for a
// task), a departure whose next one may leave within about followerLead
// (above ~2,000/s, and a burst under slack), and while the tasks run in
// line lately were too long for the gap (inlineTook).
//
// The alarm is set from the pacer's time at the departure (Pacer.Next). A
// hold (pause, quota, the previous request's write) only delays the next
// departure, so it is left out: with an HTTP sink the write is reported
// early in the task and the next departure is due an interval after it,
// whatever the response takes (TestLaneInLineWireReporter). What can make
// the next departure earlier than that time while a task runs in line — a
// reload to a higher rate, an operator's resume of a pause — waits at most
// for the end of that task or the old time.

// followerLead is how long before the next departure could be due the
// follower's alarm goes off when the leader's task has not ended: its
// wake-up (~20–90 µs here, the waiter's early margin, wait_linux.go) and
// the loop's steps up to its wait for the departure fit in it. It is at most
// half the gap to the next departure. Above 1,000/s a lane whose sink gates
// its writes releases the departure up to gateLead before its instant
// (gate.go), so the follower has less than followerLead before the release
// (above 3,333/s its alarm comes after it): a follower that takes the lead
// then releases late, and the departure is late only past its instant,
// which the make-up covers as any late wake-up.
const followerLead = 250 * time.Microsecond

// alarm is a one-shot timer that one goroutine waits for while another
// arms and disarms it (timerfdAlarm on Linux).
type alarm interface {
	arm(at time.Time) // go off at at, or at once when at has passed
	disarm()          // cancel, with no wake-up of the waiter
	wait() error      // block until it went off; an error when it cannot work
	// stop makes the alarm go off at once, safe against a close by the
	// waiter meanwhile (the end of the loop, when the waiter may have
	// seen followerStopped already).
	stop()
	close()
}

// alarmMaker is a Waiter on the real clock that can make alarms
// (PreciseWaiter on Linux).
type alarmMaker interface{ newAlarm() (alarm, error) }

// realClock returns w, or the waiter a wrapper of it (WithWaiter) wraps, as
// an alarmMaker: a waiter on the real clock (the precise waiter). It is
// what lets the departure loop run tasks in line (setupRelay) and spin
// during a pull's burst (burst.go); TimerWaiter, the fake clock's, is not.
func realClock(w Waiter) (alarmMaker, bool) {
	if u, wraps := w.(interface{ Unwrap() Waiter }); wraps {
		w = u.Unwrap()
	}
	am, ok := w.(alarmMaker)
	return am, ok
}

// The states of a follower (follower.state).
const (
	followerParked  int32 = iota // waiting for its alarm, which is disarmed
	followerArmed                // armed by the leader, whose task runs in line
	followerLeads                // its alarm went off: it took the lead
	followerStopped              // the departure loop ended
)

// follower is one goroutine of the departure loop's pair as seen by the
// other: its alarm, and whether it waits, leads or must stop.
type follower struct {
	a     alarm
	state atomic.Int32
}

// relay is a lane's pair of departure goroutines.
type relay struct {
	on     bool // the waiter makes alarms: short tasks run in line
	mu     sync.Mutex
	parked *follower // the follower waiting; nil while armed, while the other goroutine runs a task past its turn, or when the loop ended
	ended  bool      // the departure loop ended
	wg     sync.WaitGroup
	broken atomic.Bool // an alarm failed: every task goes to a worker from now on
	// inlineTook is a decaying maximum of the durations of the tasks run
	// in line, ns: a task whose predecessors took longer than the gap to
	// the next departure goes to a worker (it decays by 1/16 at each such
	// departure, so the loop tries again).
	inlineTook atomic.Int64
	// Counts for tests: tasks run in line, and leads taken by a follower.
	inLine, takeovers atomic.Int64
}

// inLine is what runInLine did with a departed message's task.
type inLine int

const (
	inLineNot   inLine = iota // not run: hand it to a worker
	inLineLeads               // run in line, and this goroutine still leads
	inLineLost                // run in line past its turn: the follower leads now
)

// setupRelay makes the pair's alarms when the waiter can (Start, before
// the departure loop starts); mine is the first goroutine's.
func (l *Lane) setupRelay() (mine, other *follower) {
	r := &l.relay
	r.wg.Add(1) // the departure loop's first goroutine
	am, ok := realClock(l.waiter)
	if !ok {
		return nil, nil
	}
	a1, err := am.newAlarm()
	if err != nil {
		return nil, nil
	}
	a2, err := am.newAlarm()
	if err != nil {
		a1.close()
		return nil, nil
	}
	r.on = true
	r.wg.Add(1)
	return &follower{a: a1}, &follower{a: a2}
}

// departPair is the body of each goroutine of the departure loop: it leads
// (first when leading), follows when its task outlasted its turn, and
// returns when the loop ended. The goroutine that sees the end ends the
// loop (endDepartures).
func (l *Lane) departPair(ctx context.Context, cancel context.CancelFunc, me *follower, leading bool) {
	defer l.relay.wg.Done()
	for {
		if leading && l.leadDepartures(ctx, me) {
			l.endDepartures(cancel, me)
			return
		}
		if !l.relay.follow(me) {
			return
		}
		leading = true
	}
}

// leadDepartures runs the departure loop while the calling goroutine leads
// it: true when the loop must end, false when a task it ran in line
// outlasted its turn and the follower took the lead.
func (l *Lane) leadDepartures(ctx context.Context, me *follower) bool {
	for {
		m, now, ok := l.nextDeparture(ctx)
		if !ok {
			return true
		}
		if m == nil {
			continue
		}
		switch l.runInLine(m, now, me) {
		case inLineNot:
			l.startTask(m) // on a worker (workers.go)
		case inLineLost:
			return false
		}
		// After the departure: the shared schedule may reserve ahead.
		l.prefetchSlots(ctx)
	}
}

// endDepartures ends the departure loop (on the goroutine that leads it):
// the parked follower stops, and Drain may go on.
func (l *Lane) endDepartures(cancel context.CancelFunc, me *follower) {
	r := &l.relay
	r.mu.Lock()
	r.ended = true
	f := r.parked
	r.parked = nil
	r.mu.Unlock()
	if f != nil {
		f.state.Store(followerStopped)
		f.a.stop() // it goes off at once; the follower sees it must stop
	}
	if me != nil {
		me.a.close()
	}
	l.waiter.Unbind()
	cancel()
	close(l.departDone)
}

// runInLine runs m's task on the calling goroutine (the leader, which
// departed m at now) when it is expected to end before the next departure
// can be due, with the follower armed in case it does not (see the top of
// this file).
func (l *Lane) runInLine(m *shaper.Message, now time.Time, me *follower) inLine {
	r := &l.relay
	if me == nil || l.global != nil || r.broken.Load() {
		return inLineNot
	}
	// The pacer's time alone: a hold (an operator's pause, the quota, the
	// previous request's write) only delays the next departure, and ends
	// early when the hold does (a resume; the write is reported early in
	// an HTTP task, maxWireWait after the departure at worst).
	l.mu.Lock()
	next := l.pacer.Next(now)
	l.mu.Unlock()
	gap := next.Sub(now)
	lead := min(followerLead, gap/2)
	took := time.Duration(r.inlineTook.Load())
	if gap-lead <= took {
		r.inlineTook.Store(int64(took - took/16))
		return inLineNot
	}
	r.mu.Lock()
	f := r.parked
	r.parked = nil
	r.mu.Unlock()
	if f == nil { // the other goroutine still runs a task past its turn
		return inLineNot
	}
	f.state.Store(followerArmed)
	f.a.arm(next.Add(-lead))
	r.inLine.Add(1)
	end := l.runTask(m)
	took = time.Duration(r.inlineTook.Load())
	r.inlineTook.Store(int64(max(end.Sub(now), took-took/16)))
	if f.state.CompareAndSwap(followerArmed, followerParked) {
		f.a.disarm()
		r.mu.Lock()
		r.parked = f
		r.mu.Unlock()
		return inLineLeads
	}
	return inLineLost // the alarm went off: f leads (followerLeads)
}

// follow parks the calling goroutine as the follower until its alarm goes
// off while armed (true: it leads now) or the loop ended (false).
func (r *relay) follow(me *follower) bool {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		me.a.close()
		return false
	}
	me.state.Store(followerParked)
	r.parked = me
	r.mu.Unlock()
	for {
		if err := me.a.wait(); err != nil {
			// Not seen in practice (a timerfd read fails only when
			// closed). Stop running tasks in line, and poll the state
			// so that an armed alarm is still answered.
			r.broken.Store(true)
			time.Sleep(followerLead / 5)
		}
		switch me.state.Load() {
		case followerArmed:
			if me.state.CompareAndSwap(followerArmed, followerLeads) {
				r.takeovers.Add(1)
				return true
			}
		case followerStopped:
			me.a.close()
			return false
		}
		// Gone off after the leader disarmed it: wait again.
	}
}
