package drain

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Operator control of a lane (SPEC §3 Operator control): a hold (the
// operator's pause), purge, and the lane's status for the admin API. The
// daemon keeps the operator's decisions on the NATS server and applies them
// to every replica through these methods; the lane itself keeps them only in
// memory.

// Hold is an operator's pause of a lane.
type Hold struct {
	// Until is when the pause ends by itself; zero means until Resume.
	Until time.Time
	// Reason is the operator's free text, shown by the admin API.
	Reason string
}

// indefinite is how far ahead the departure loop sleeps under a hold with no
// end: Resume wakes it sooner.
const indefinite = time.Hour

// active reports whether h holds departures at now.
func (h *Hold) active(now time.Time) bool {
	return h != nil && (h.Until.IsZero() || now.Before(h.Until))
}

// Hold pauses the lane's departures until h.Until (zero: until Resume),
// like a Retry-After pause: nothing is nak'd, held messages keep their
// in-progress acks, fetching stops when the bucket is full. A later Hold
// replaces an earlier one.
func (l *Lane) Hold(h Hold) {
	l.mu.Lock()
	now := time.Now()
	was := l.hold.active(now)
	l.hold = &h
	l.syncPacerHold(now)
	l.mu.Unlock()
	if !was {
		until := "resume"
		if !h.Until.IsZero() {
			until = h.Until.Format(time.RFC3339)
		}
		l.log.Info("lane paused by operator", "until", until, "reason", h.Reason)
	}
	l.m.Paused.Set(1)
	l.m.RateLimit.Set(0)
	l.wakeDepartures()
}

// Resume ends an operator's hold. Departures continue at the pacer's times
// with no burst: the slack credit is the most that can leave at once (G2).
// It reports whether a hold was active.
func (l *Lane) Resume() bool {
	l.mu.Lock()
	now := time.Now()
	was := l.hold.active(now)
	l.hold = nil
	l.syncPacerHold(now)
	l.mu.Unlock()
	if was {
		l.log.Info("lane resumed by operator")
	}
	l.wakeDepartures()
	return was
}

// HoldState returns the operator's hold in force at now, if any.
func (l *Lane) HoldState(now time.Time) (Hold, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.hold.active(now) {
		return Hold{}, false
	}
	return *l.hold, true
}

// syncPacerHold tells the pacer, with l.mu held, whether something holds
// the lane at now — an operator's hold, an open breaker or a spent quota
// (quota.go) — so that it cools as if idle and the end of the hold goes
// through the warmup ramp.
func (l *Lane) syncPacerHold(now time.Time) {
	l.pacer.Hold(now, l.hold.active(now) || l.brk.b.State() != shaper.BreakerClosed || l.quota.held)
}

// holdUntil returns, with l.mu held, the instant before which the hold
// keeps departures at now (a bounded sleep for a hold with no end), and
// whether a hold is active.
func (l *Lane) holdUntil(now time.Time) (time.Time, bool) {
	if !l.hold.active(now) {
		return time.Time{}, false
	}
	if l.hold.Until.IsZero() {
		return now.Add(indefinite), true
	}
	return l.hold.Until, true
}

// noteHoldEnd logs, once, that a timed hold or a Retry-After pause ended by
// itself (the housekeeping tick calls it).
func (l *Lane) noteHoldEnd(now time.Time) {
	l.mu.Lock()
	h := l.hold
	ended := h != nil && !h.Until.IsZero() && !now.Before(h.Until)
	if ended {
		l.hold = nil
		l.syncPacerHold(now)
	}
	pauseEnd := l.pacer.PausedUntil()
	pauseEnded := !pauseEnd.IsZero() && !now.Before(pauseEnd) && l.pauseLogged.Before(pauseEnd)
	if pauseEnded {
		l.pauseLogged = pauseEnd
	}
	l.mu.Unlock()
	if ended {
		l.log.Info("operator pause ended", "until", h.Until.Format(time.RFC3339), "reason", h.Reason)
	}
	if pauseEnded {
		l.log.Info("downstream pause ended", "until", pauseEnd.Format(time.RFC3339Nano))
	}
}

func (l *Lane) wakeDepartures() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// PurgeMark is what an operator's purge covers (SPEC §3 Operator control):
// the messages of Stream up to stream sequence UpTo that the stream stored
// no later than Before (the server's time of that last message). Stream and
// Before keep a purge from reaching a stream that was recreated, or another
// stream the lane was moved to, whose sequences start again at 1: a purge
// recorded by sequence alone dead-lettered the new messages up to the old
// sequence (found reading the docs against the code: the lane recreates a
// lost stream itself). An empty Stream is any stream and a zero Before any
// time (records of earlier versions); a message whose source gives no
// publish time is judged by its sequence.
type PurgeMark struct {
	Stream string
	UpTo   uint64
	Before time.Time
}

// Covers reports whether m falls under p.
func (p PurgeMark) Covers(m *shaper.Message) bool {
	switch {
	case p.UpTo == 0 || m.StreamSeq > p.UpTo:
		return false
	case p.Stream != "" && m.Stream != p.Stream:
		return false
	case !p.Before.IsZero() && !m.Published.IsZero() && m.Published.After(p.Before):
		return false
	}
	return true
}

// Merge is p followed by a later purge q: q's alone when it is of another
// stream (the lane moved), else the later sequence and time of the two.
func (p PurgeMark) Merge(q PurgeMark) PurgeMark {
	if p.UpTo == 0 || p.Stream != q.Stream {
		return q
	}
	if q.Before.After(p.Before) {
		p.Before = q.Before
	}
	p.UpTo = max(p.UpTo, q.UpTo)
	return p
}

// Purge moves every message the lane holds that mark covers to the dead
// letter with reason purged, and does the same with every such message it
// receives later (what its consumer still had pending, and redeliveries).
// A mark merges with the lane's earlier ones (PurgeMark.Merge). It returns
// how many it took from the bucket. Messages in flight finish their
// attempt.
func (l *Lane) Purge(mark PurgeMark) int {
	for {
		cur := l.purgeMark.Load()
		next := mark
		if cur != nil {
			next = cur.Merge(mark)
		}
		if l.purgeMark.CompareAndSwap(cur, &next) {
			mark = next
			break
		}
	}
	// The removal and the queueing of its dead letters happen under l.mu:
	// the removal frees slots and wakes the fetch loop, whose admissions of
	// messages under the purge queue theirs through l.purge, which takes
	// l.mu too, and so come after these (the stream's order).
	l.mu.Lock()
	removed, empty := l.bucket.RemoveIf(mark.Covers)
	if empty {
		l.pacer.SetBusy(time.Now(), false)
	}
	start := l.queuePurgedLocked(removed)
	l.mu.Unlock()
	if start {
		l.startPurging()
	}
	l.m.BucketDepth.Set(float64(l.bucket.Len()))
	if empty && len(removed) > 0 {
		l.wakeDepartures() // a loop waiting for a hold's end has no head now
	}
	if len(removed) > 0 {
		l.log.Info("lane purged by operator", "dead_lettered", len(removed), "stream", mark.Stream, "up_to_stream_seq", mark.UpTo)
	}
	return len(removed)
}

// purged reports whether m falls under a purge. Every admission asks, so it
// takes no lock.
func (l *Lane) purged(m *shaper.Message) bool {
	p := l.purgeMark.Load()
	return p != nil && p.Covers(m)
}

// purge dead-letters ms with reason purged, one after the other in the
// order they were purged (the bucket's order, then arrival): a replay of
// the purged dead letters keeps the stream's order.
func (l *Lane) purge(ms ...*shaper.Message) {
	l.mu.Lock()
	start := l.queuePurgedLocked(ms)
	l.mu.Unlock()
	if start {
		l.startPurging()
	}
}

// queuePurgedLocked appends ms to the purge queue and reports whether the
// goroutine that dead-letters it must be started; l.mu is held.
func (l *Lane) queuePurgedLocked(ms []*shaper.Message) (start bool) {
	if len(ms) == 0 {
		return false
	}
	l.purgeQ = append(l.purgeQ, ms...)
	start = !l.purging
	l.purging = true
	return start
}

// startPurging starts the goroutine that dead-letters the purge queue, one
// message after the other, until it is empty.
func (l *Lane) startPurging() {
	l.tasks.Add(1)
	go func() {
		defer l.tasks.Done()
		for {
			l.mu.Lock()
			if len(l.purgeQ) == 0 {
				l.purging = false
				l.mu.Unlock()
				return
			}
			m := l.purgeQ[0]
			l.purgeQ = l.purgeQ[1:]
			l.mu.Unlock()
			l.deadLetter(m, shaper.ReasonPurged, errPurged, notAttempted)
		}
	}()
}

var errPurged = errors.New("purged by an operator")

// Status is a lane's state for the admin API (SPEC §6 GET /v1/lanes).
type Status struct {
	// State is running, paused (an operator's hold or a downstream's
	// Retry-After), open (the breaker, SPEC §3), draining or stopped.
	State string
	// Hold is the operator's hold in force (State paused), if any.
	Hold *Hold
	// PausedUntil is when the pause in force ends (zero: until resumed).
	PausedUntil time.Time
	// Limit is rate.limit and Rate the rate in force (warmup, pause, quota wait, adaptive rate,
	// fallback included), in messages per second.
	Limit, Rate float64
	// Achieved is the departures per second over the last AchievedWindow.
	Achieved float64
	// Depth and Capacity are the bucket's messages and capacity.
	Depth, Capacity int
	// InFlight is the number of tasks running.
	InFlight int
	// QueueWaitP99 is the 99th percentile of the last departures' queue
	// waits (admission to departure).
	QueueWaitP99 time.Duration
	// BreakerHeld is true when the open breaker waits for an operator's
	// resume (a 410 Gone) with no probes.
	BreakerHeld bool
	// LastError is the last failed attempt's error, "" when none.
	LastError string
	// Delivered, Nacked and DeadLettered count this process's final verbs.
	Delivered, Nacked, DeadLettered int64
	// QuotaRemaining is what rate.quota still allows in the window that
	// ends now, in messages; -1 when the lane has no quota.
	QuotaRemaining int
	// QuotaWait is true while the lane waits for its quota (State paused,
	// PausedUntil the end of the wait).
	QuotaWait bool
}

// Lane states (Status.State).
const (
	StateRunning  = "running"
	StatePaused   = "paused"
	StateOpen     = "open"
	StateDraining = "draining"
	StateStopped  = "stopped"
)

// AchievedWindow is the window of Status.Achieved (SPEC §6: the last 10 s).
const AchievedWindow = 10 * time.Second

// Status returns the lane's state at now.
func (l *Lane) Status(now time.Time) Status {
	cfg := l.conf()
	s := Status{State: StateRunning, Limit: float64(cfg.Rate.Limit), Depth: l.bucket.Len(),
		Capacity: l.bucket.Capacity(), Delivered: l.delivered.Load(), Nacked: l.nacked.Load(),
		DeadLettered: l.deadLettered.Load()}
	l.mu.Lock()
	s.Rate = l.pacer.Rate(now)
	s.InFlight = len(l.inflight)
	if until := l.pacer.PausedUntil(); now.Before(until) {
		s.State, s.PausedUntil = StatePaused, until
	}
	s.QuotaRemaining = l.quotaRemaining(now)
	if l.quota.held && l.quota.end.After(now) {
		s.State, s.QuotaWait, s.Rate = StatePaused, true, 0
		if l.quota.end.After(s.PausedUntil) {
			s.PausedUntil = l.quota.end
		}
	}
	if st := l.brk.b.State(); st != shaper.BreakerClosed {
		s.State, s.Rate, s.BreakerHeld = StateOpen, 0, st == shaper.BreakerHeld
	}
	if l.hold.active(now) {
		h := *l.hold
		s.State, s.Hold, s.Rate = StatePaused, &h, 0
		if h.Until.IsZero() || h.Until.After(s.PausedUntil) {
			s.PausedUntil = h.Until
		}
	}
	l.mu.Unlock()
	switch {
	case l.stopped.Load():
		s.State = StateStopped
	case l.draining.Load():
		s.State = StateDraining
	}
	if e, ok := l.lastErr.Load().(string); ok {
		s.LastError = e
	}
	s.Achieved, s.QueueWaitP99 = l.recent.read(now)
	return s
}

// recentStats keeps what Status reports about the last seconds: departures
// per second over AchievedWindow and the last queue waits.
type recentStats struct {
	mu     sync.Mutex
	second [11]int64 // departures in unix second i at i % 11
	stamp  [11]int64 // which second each slot holds
	waits  [512]time.Duration
	nWaits int
}

// depart records one departure at now that waited wait in the bucket.
func (r *recentStats) depart(now time.Time, wait time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sec := now.Unix()
	i := sec % int64(len(r.second))
	if r.stamp[i] != sec {
		r.stamp[i], r.second[i] = sec, 0
	}
	r.second[i]++
	r.waits[r.nWaits%len(r.waits)] = wait
	r.nWaits++
}

// read returns the departures per second over the AchievedWindow of whole
// seconds before now's second, and the p99 of the last queue waits.
func (r *recentStats) read(now time.Time) (float64, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	cur := now.Unix()
	secs := int64(AchievedWindow / time.Second)
	for sec := cur - secs; sec < cur; sec++ {
		if i := sec % int64(len(r.second)); r.stamp[i] == sec {
			n += r.second[i]
		}
	}
	k := min(r.nWaits, len(r.waits))
	if k == 0 {
		return float64(n) / float64(secs), 0
	}
	w := slices.Clone(r.waits[:k])
	slices.Sort(w)
	return float64(n) / float64(secs), w[min(k-1, k*99/100)]
}
