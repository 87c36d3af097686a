package drain

import (
	"context"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// departLoop releases messages from the bucket at the pacer's times, on a
// pair of goroutines when the lane runs short tasks in line (follower.go):
// this one leads first, other (nil without the pair) follows.
func (l *Lane) departLoop(mine, other *follower) {
	l.waiter.Bind()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-l.departStop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if other != nil {
		go l.departPair(ctx, cancel, other, false)
	}
	l.departPair(ctx, cancel, mine, true)
}

// nextDeparture waits for the next departure and records it: the departed
// message (its task not started yet) and the departure instant; nil when
// every message at the head had expired; false when the loop must end.
func (l *Lane) nextDeparture(ctx context.Context) (*shaper.Message, time.Time, bool) {
	// 0. An overtaken request at its gate leaves first (gate.go).
	if l.ot.n.Load() > 0 {
		return l.redepart(ctx)
	}
	// 1. A message at the head (expired ones go to the dead letter
	// without taking a departure).
	head, headWaited, ok := l.awaitHead(ctx)
	if !ok {
		return nil, time.Time{}, false
	}
	if head == nil { // an overtaken request came to its gate
		return nil, time.Time{}, true
	}
	// 2. A free task slot (G5: at most max_in_flight at once).
	unfull, slotWaited, got, ok := l.slots.acquire(ctx, l.ot.wake)
	if !ok {
		return nil, time.Time{}, false
	}
	if !got { // an overtaken request came to its gate: its task has a slot
		return nil, time.Time{}, true
	}
	// While the source is disconnected, hold departures: a delivery's
	// ack could not reach the server, and the message would likely be
	// delivered again after the reconnect.
	connWaited, ok := l.awaitConnected(ctx)
	if !ok {
		l.slots.release()
		return nil, time.Time{}, false
	}
	var since time.Time // when the work was ready, if the loop waited for none of it
	if !headWaited && !slotWaited && !connWaited {
		since = l.readySince(head, unfull)
	}
	// 3. The pacer's time. A pause (Retry-After) wakes the wait.
	ready, now, scheduled, gone, ok := l.awaitDepartureTime(ctx, since)
	if !ok {
		l.slots.release()
		return nil, time.Time{}, false
	}
	if gone { // the bucket emptied meanwhile: wait for a head again
		l.slots.release()
		return nil, now, true
	}
	// 4. Departure, of the first message that has not expired at this
	// instant (SPEC §3 Max age: after every wait; an expired message
	// takes no departure slot, the next one leaves in its place).
	m, empty := l.popDeliverable(now)
	if m == nil { // all expired, or the previous request began its write after the loop looked
		l.slots.release()
		return nil, now, true
	}
	l.depart(m, empty, ready, now, scheduled)
	return m, now, true
}

// readySince is when the work of a departure that waited for nothing (a
// head, a task slot, the source's connection) was ready: at the previous
// departure, or later when the head was admitted after it (the bucket
// emptied and refilled while the loop was away) or when a task slot was
// freed after all were taken (unfull). The zero time before the first
// departure: then the work is ready when the loop looks.
//
// Stamping the clock when the loop comes back instead turned the loop's
// own delay into idle time: a task run in line that overran its turn, a
// follower that woke late, or a thread the machine stalled between two
// departures made the work look ready late, and Pacer.Depart neither made
// the lateness up (MakeUpLag) nor counted it as forgiven. At 1,000/s
// through the HTTP sink with -race the departures fell 35 requests of
// 10,100 shorter than the lateness the pacer reported (TestHTTPWireRate's
// ledger; docs/lessons.md, session 27).
//
// Not before the replica's own quota let the departure go (rate.quota):
// a quota wait the loop was away for never reached quotaUntil, which
// holds the pacer and marks its end (quotaReady), and it is a wait, not
// lateness (found by review: a 112 ms quota wait under a stall reported
// as 131 ms of forgiven lateness, TestReadySinceQuotaWait).
func (l *Lane) readySince(head *shaper.Message, unfull time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	since := l.lastDeparture
	if since.IsZero() {
		return since
	}
	if head.Admitted.After(since) {
		since = head.Admitted
	}
	if unfull.After(since) {
		since = unfull
	}
	if l.quota.q != nil {
		since = l.quota.q.Next(since)
	}
	return since
}

// awaitDepartureTime waits until the next message may leave: the breaker
// lets it (breaker.go), the pacer's time, an operator's hold (control.go),
// the previous request's write (WireReporter) and the shared schedule's
// slot (global.go) have come. A pause (Retry-After) wakes the wait. It
// returns when the loop was ready to depart, the departure instant, and
// when the departure was due (the lateness metric); gone when the bucket
// was found empty after a wait (max_age and a purge remove messages while
// the lane is held: the loop waits for a head again, and a drain sees the
// bucket empty instead of waiting out its timeout); false when the loop
// must end. since is when the work was ready, if earlier than now
// (readySince; the zero time: now).
func (l *Lane) awaitDepartureTime(ctx context.Context, since time.Time) (ready, now, scheduled time.Time, gone, ok bool) {
	now = time.Now()
	ready = now
	if !since.IsZero() && since.Before(now) {
		ready = since
	}
	scheduled = now // the instant the departure was due (lateness metric)
	l.takeover(now) // source.standby (standby.go)
	for {
		// While the breaker is open only its probe leaves (breaker.go).
		if waited, ok := l.awaitBreaker(ctx, now); !ok {
			return ready, now, scheduled, false, false
		} else if waited {
			ready = time.Now()
			now, scheduled = ready, ready
			if l.bucket.Peek() == nil {
				return ready, now, scheduled, true, true
			}
		}
		at, lead := l.departureAt(now)
		if !at.After(now) && l.global != nil {
			var ok bool // the shared schedule's slot (global.go)
			var after time.Time
			if at, after, ok = l.globalAt(ctx, now); !ok {
				return ready, now, scheduled, false, false
			}
			if after.After(now) {
				// Waiting for the store is a wait, like one for a task
				// slot: the departure leaves after it, and its time earns
				// no make-up (G2: a switch to or from the fallback earns
				// no credit).
				now, ready, scheduled = after, after, after
			}
		}
		if !at.After(now) {
			return ready, now, scheduled, false, true
		}
		scheduled = at
		// A sink that gates its writes gets the task a lead early, and the
		// departure counts at its instant (gate.go).
		release := at.Add(-lead)
		if !release.After(now) || (lead > 0 && release.Sub(now) < gateEarlyRelease) {
			return ready, at, scheduled, false, true
		}
		var woke bool
		var err error
		if l.burstSpin && l.burst.spinFor(l.conf().Rate.Limit, now, release) {
			woke, err = l.spinUntil(ctx, release)
		} else {
			woke, err = l.waiter.Wait(ctx, release, l.wake)
		}
		if err != nil {
			return ready, now, scheduled, false, false
		}
		now = time.Now()
		// Only a removal empties the bucket under the loop, and it wakes
		// the loop (sweepExpired, Purge): a timed wait needs no look.
		if woke && l.bucket.Peek() == nil {
			return ready, now, scheduled, true, true
		}
	}
}

// departureAt is when the next message may leave as seen at now: the
// pacer's time, held by an operator's pause and by the write of the
// previous request (at most maxWireWait or an interval); and the lead
// before it at which the loop may release it to a sink that gates its
// writes (gate.go).
func (l *Lane) departureAt(now time.Time) (at time.Time, lead time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var rate float64 // read once, for the lead and the wire hold
	if l.gatesWire || l.unwired != nil {
		rate = l.pacer.Rate(now)
	}
	if l.gatesWire && rate > 0 {
		lead = gateLead(shaper.Limit(rate).Interval())
	}
	at = l.pacer.Next(now)
	if l.gatesWire {
		// The span floor (shaper.Pacer.WireFloor): windows of every
		// length of 1 ms or more at the downstream, not only those of a
		// whole number of intervals. It holds the departure itself, so
		// that the task keeps its lead before the gate (gate.go).
		if f := l.pacer.WireFloor(now); f.After(at) {
			at = f
		}
	}
	if until, held := l.holdUntil(now); held && until.After(at) {
		at = until // an operator's pause (control.go)
	}
	if until, held := l.quotaUntil(now, at); held && until.After(at) {
		at = until // rate.quota (quota.go)
	}
	if w, held := l.wireHold(rate); held && w.After(at) {
		at = w
	}
	return at, lead
}

// wireHold is when the wait for the previous request's write ends
// (WireReporter): maxWireWait or an interval after its departure, or after
// its gate opened late (gate.go); false when there is none. l.mu held; rate
// is the pacer's.
func (l *Lane) wireHold(rate float64) (time.Time, bool) {
	if l.unwired == nil || rate <= 0 {
		return time.Time{}, false
	}
	return l.departedAt.Add(max(maxWireWait, shaper.Limit(rate).Interval())), true
}

// wireHeldAt reports whether a departure at now must still wait for the
// previous request's write: its gate opened after the loop's look, so the
// request is being written (gate.go: a departure now would overtake it
// mid-write). l.mu held.
func (l *Lane) wireHeldAt(now time.Time) bool {
	if l.unwired == nil {
		return false
	}
	w, held := l.wireHold(l.pacer.Rate(now))
	return held && w.After(now)
}

// depart records m's departure at now (ready: when the loop was ready;
// scheduled: when it was due) in the pacer, the breaker and the metrics,
// and counts its task (the loop starts it: leadDepartures). empty says the
// bucket is empty after it. l.mu is held (popDeliverable), and released.
func (l *Lane) depart(m *shaper.Message, empty bool, ready, now, scheduled time.Time) {
	prev := l.recordDeparture(m, ready, now)
	if empty {
		l.pacer.SetBusy(now, false)
	}
	l.inflight[m] = struct{}{}
	l.mu.Unlock()
	if l.global != nil {
		l.global.held = time.Time{} // the slot is used
	}
	l.countDeparture(m, prev, now, scheduled)
	l.m.QueueWait.Observe(now.Sub(m.Admitted).Seconds())
	if c := m.FairClass(); c != "" { // bucket.fair_key
		l.m.FairQueueWait[c].Observe(now.Sub(m.Admitted).Seconds())
	}
	l.m.BucketDepth.Set(float64(l.bucket.Len()))
	l.m.InFlight.Inc()
	l.tasks.Add(1)
}

// wireDeparts records m's departure at now for a sink that reports its
// writes (WireReporter): the next departure waits for m's write, and the
// previous request, if its write was not reported, is overtaken (gate.go).
// l.mu held.
func (l *Lane) wireDeparts(m *shaper.Message, now time.Time) {
	if !l.reportsWire {
		return
	}
	if l.gatesWire && l.unwired != nil {
		l.overtake(l.unwired)
	}
	l.unwired, l.departedAt = m, now
	if l.global != nil {
		l.global.wireSlot = l.global.held // zero in the fallback
	}
}

// awaitConnected waits while the source reports it is disconnected; it
// reports whether it waited, and false when ctx ended first.
func (l *Lane) awaitConnected(ctx context.Context) (waited, ok bool) {
	c, conn := l.src.(Connector)
	if !conn || c.Connected() {
		return false, true
	}
	l.log.Warn("source disconnected: departures held until it reconnects")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !c.Connected() {
		select {
		case <-ctx.Done():
			return true, false
		case <-tick.C:
		}
	}
	l.log.Info("source reconnected: departures resume")
	return true, true
}

// awaitHead waits until the bucket has a deliverable message at its head,
// dead-lettering expired ones (bucket.max_age, Shaper-Deadline), and
// returns it; waited reports whether it waited for one (readySince). ok is
// false when the loop must end: stopped, or draining with the bucket empty
// and fetching over.
func (l *Lane) awaitHead(ctx context.Context) (head *shaper.Message, waited, ok bool) {
	for {
		if head = l.bucket.Peek(); head != nil {
			// Expired messages at the head need no slot and no wait.
			if l.expiryOn() && l.sweepExpired(time.Now(), true) {
				continue
			}
			return head, waited, true
		}
		waited = true
		select {
		case <-l.fetchDone: // closes only when a drain stopped fetching
			if l.bucket.Len() > 0 {
				continue
			}
			if !l.gatedInFlight() {
				return nil, waited, false
			}
			// A gated lane's task still running may yet need a departure
			// of its own (gate.go): the loop ends after the last one.
			select {
			case <-l.ot.taskEnded:
			case <-l.ot.wake: // an overtaken request came to its gate
				return nil, waited, true
			case <-ctx.Done():
				return nil, waited, false
			}
			continue
		default:
		}
		select {
		case <-l.bucket.NonEmpty():
		case <-l.fetchDone:
		case <-l.ot.wake: // an overtaken request came to its gate (gate.go)
			return nil, waited, true
		case <-ctx.Done():
			return nil, waited, false
		}
	}
}

// gatedInFlight reports whether a lane that gates its writes has tasks
// running (a drain's departure loop waits for them: gate.go).
func (l *Lane) gatedInFlight() bool {
	if !l.gatesWire {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.inflight) > 0
}

// popDeliverable pops the head for a departure at now, dead-lettering the
// messages at the head that expired (bucket.max_age) first; nil when none
// is left. What the housekeeping sweep may remove meanwhile is expired at a
// later instant, so what Pop returns has not expired at now.
//
// A message is returned with l.mu held, for depart to record its departure
// in the pacer before a fetch's projected wait (bucket.max_wait) can see
// the bucket without it (fetch.go admits under l.mu).
func (l *Lane) popDeliverable(now time.Time) (*shaper.Message, bool) {
	l.sweepExpired(now, true)
	l.mu.Lock()
	if l.wireHeldAt(now) { // the previous request's write began after the loop's look
		l.mu.Unlock()
		return nil, false
	}
	m, empty := l.bucket.Pop()
	if m == nil {
		l.mu.Unlock()
	}
	return m, empty
}

// sweepExpired dead-letters the messages of the bucket that are older than
// bucket.max_age at now: only at the head when headOnly (the departure
// loop, cheap), else anywhere (housekeeping, so that a paused or blocked
// lane dead-letters messages as they pass max_age). It reports whether any
// was removed.
func (l *Lane) sweepExpired(now time.Time, headOnly bool) bool {
	if !l.expiryOn() {
		return false
	}
	maxAge := l.conf().Bucket.MaxAge
	expired := func(m *shaper.Message) bool { return shaper.Expired(m, now, maxAge) }
	var removed []*shaper.Message
	var empty bool
	if headOnly {
		removed, empty = l.bucket.DropHeadWhile(expired) // the departure loop: O(expired)
	} else {
		removed, empty = l.bucket.RemoveIf(expired)
	}
	if len(removed) == 0 {
		return false
	}
	if empty {
		l.mu.Lock()
		l.pacer.SetBusy(now, false)
		l.mu.Unlock()
		if !headOnly { // the loop's own sweep needs no wake
			l.wakeDepartures() // a loop waiting for a hold's end has no head now
		}
	}
	l.m.BucketDepth.Set(float64(l.bucket.Len()))
	for _, m := range removed {
		l.expire(m, now, maxAge)
	}
	return true
}

// expiryOn reports whether a message can expire: bucket.max_age is set, or
// a message with a Shaper-Deadline was admitted.
func (l *Lane) expiryOn() bool { return l.conf().Bucket.MaxAge > 0 || l.deadlines.Load() }

// expire dead-letters m, which is older than maxAge or past its
// Shaper-Deadline at now (shaper.Expired), with reason expired.
func (l *Lane) expire(m *shaper.Message, now time.Time, maxAge time.Duration) {
	cause := shaper.ExpiryCause(m, now, maxAge)
	l.tasks.Add(1)
	go func() {
		defer l.tasks.Done()
		l.deadLetter(m, shaper.ReasonExpired, cause, notAttempted)
	}()
}

// wired moves the pacer's spacing anchor to when m's request really left
// (shaper.WithWire; exact: see there) and wakes the departure loop to
// re-read its time.
func (l *Lane) wired(m *shaper.Message, g *taskGate, t time.Time, exact bool) {
	l.mu.Lock()
	var held time.Duration
	if g != nil { // its gate may have held it for min spacing (gateAt)
		held, g.held = g.held, 0
	}
	moved := l.pacer.WireHeld(m.Departed, held, t, exact)
	if moved {
		l.countForgiven()
	}
	l.quotaWired(m.Departed, t) // rate.quota (quota.go)
	var slot time.Time
	var shift time.Duration
	if l.unwired == m {
		l.unwired = nil
		moved = true
		if l.global != nil { // the shared schedule (global.go)
			slot = l.global.wireSlot
			shift = l.lateWrite(slot, m.Departed, t)
		}
	}
	l.mu.Unlock()
	if shift > 0 {
		l.shiftSchedule(slot, shift)
	}
	if moved {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// countForgiven adds to the metrics what the pacer gave up since the last
// call (shaper.Pacer.TakeForgiven, shaper_departure_lateness_forgiven_seconds_total);
// l.mu held. A global lane on the shared schedule has its own account
// (shaper_global_slots_dropped_total): its slots make the local pacer look
// late at every departure (Pacer.Rebase), so nothing is counted then.
func (l *Lane) countForgiven() {
	late, wire := l.pacer.TakeForgiven()
	if l.global != nil && !l.global.fallbackNow.Load() {
		return
	}
	if late > 0 {
		l.m.ForgivenLate.Add(late.Seconds())
	}
	if wire > 0 {
		l.m.ForgivenWire.Add(wire.Seconds())
	}
}

// Pause holds the lane's departures until until (a downstream's Retry-After).
// A global lane also extends the shared pause, so that every replica
// pauses (best effort: when the shared store fails, only this one does).
func (l *Lane) Pause(until time.Time) {
	l.mu.Lock()
	extended := until.After(l.pacer.PausedUntil())
	l.pacer.Pause(until)
	l.mu.Unlock()
	if extended {
		l.log.Info("lane paused by downstream", "until", until.Format(time.RFC3339Nano))
		l.m.Paused.Set(1)
		l.m.RateLimit.Set(0)
		select {
		case l.wake <- struct{}{}:
		default:
		}
		if l.global != nil {
			l.pauseGlobal(until) // every replica of the lane pauses
		}
	}
}
