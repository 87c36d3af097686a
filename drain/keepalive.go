package drain

import (
	"time"

	"github.com/shaper-dev/shaper/internal/tick"
	"github.com/shaper-dev/shaper/shaper"
)

// houseEvery is the house loop's period while the lane has something to
// watch: gauges, the expiry sweep, the end of a pause or hold, the fallback
// probe. houseIdleEvery is the longest it stretches to while the lane is
// quiet (nothing held or in flight, no pause or hold, the rate steady): an
// idle daemon's wake-ups (issue 15: an idle daemon costs nothing; 10 lanes
// woke 40 times a second for this loop alone). An admission brings the short
// period back at once (nudgeHouse).
const (
	houseEvery     = 250 * time.Millisecond
	houseIdleEvery = 2 * time.Second
)

// houseLoop refreshes gauges and sends in-progress acks for every message the
// lane holds, before the server's ack wait runs out (SPEC G7). Its ticks
// fall on the process's grid of the period (internal/tick), so the quiet
// lanes of a daemon tick together, with their pull renewals, whenever each
// last had traffic.
func (l *Lane) houseLoop() {
	defer close(l.houseDone)
	ackWait := l.conf().Source.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	progressEvery := max(ackWait/4, 50*time.Millisecond)
	period := houseEvery
	gauge := time.NewTimer(tick.Until(time.Now(), period))
	defer gauge.Stop()
	progress := time.NewTicker(progressEvery)
	defer progress.Stop()
	lastRate := -1.0
	for {
		select {
		case <-l.houseStop:
			l.flushDeadLetterLog(time.Now(), true) // the tasks are done: the last summary
			return
		case <-l.houseNudge: // an admission while the period was stretched
			period = houseEvery
			l.houseSlow.Store(false)
			gauge.Reset(tick.Until(time.Now(), period))
		case <-gauge.C:
			now := time.Now()
			l.noteHoldEnd(now) // first: the gauges below show the lane after the end
			l.mu.Lock()
			rate := l.pacer.Rate(now)
			pauseEnd := l.pacer.PausedUntil()
			paused := now.Before(pauseEnd)
			until, held := l.holdUntil(now)
			if held || l.quota.held { // quota.go
				paused, rate = true, 0
			}
			inFlight := len(l.inflight) > 0
			l.mu.Unlock()
			l.m.RateLimit.Set(rate)
			if paused {
				l.m.Paused.Set(1)
			} else {
				l.m.Paused.Set(0)
			}
			l.m.BucketDepth.Set(float64(l.bucket.Len()))
			l.m.FairActiveKeys.Set(float64(l.bucket.ActiveKeys()))
			l.sweepExpired(now, false)
			l.flushDeadLetterLog(now, false)
			l.probeIdle(now)
			if !paused && rate == lastRate && !inFlight && l.quiet() {
				period = min(2*period, houseIdleEvery)
			} else {
				period = houseEvery
			}
			lastRate = rate
			l.houseSlow.Store(period > houseEvery)
			// From the clock after the tick's work (probeIdle can wait on
			// the shared schedule), so the next tick is on the grid.
			after := time.Now()
			gauge.Reset(untilEnd(after, tick.Until(after, period), pauseEnd, until, held))
		case <-progress.C:
			l.touch(time.Now(), ackWait/2)
		}
	}
}

// untilEnd is the wait for the next house tick: d (to the period's next
// grid instant), or less when a pause (pauseEnd) or an operator's hold
// (until, when held) ends sooner, so that the gauges and the log show its
// end when it comes, not up to a period later.
func untilEnd(now time.Time, d time.Duration, pauseEnd, until time.Time, held bool) time.Duration {
	if pauseEnd.After(now) {
		d = min(d, pauseEnd.Sub(now))
	}
	if held && until.After(now) {
		d = min(d, until.Sub(now))
	}
	return d
}

// quiet reports whether the lane has nothing for the house loop to watch
// but its gauges, beyond what the tick itself checks (a pause, a hold, the
// quota, tasks in flight, the rate): nothing in the bucket, not in a shared
// schedule's fallback (see houseIdleEvery). A dead-letter summary due
// meanwhile is written at the next tick, at most houseIdleEvery late.
func (l *Lane) quiet() bool {
	return l.bucket.Len() == 0 && (l.global == nil || !l.global.fallbackNow.Load())
}

// nudgeHouse brings the house loop's short period back when it was
// stretched: one atomic load otherwise.
func (l *Lane) nudgeHouse() {
	if l.houseSlow.Load() {
		select {
		case l.houseNudge <- struct{}{}:
		default:
		}
	}
}

// touch sends InProgress for each held message last touched more than
// threshold ago.
func (l *Lane) touch(now time.Time, threshold time.Duration) {
	var due []*shaper.Message
	pick := func(m *shaper.Message) {
		last := m.Received
		if m.Touched.After(last) {
			last = m.Touched
		}
		if now.Sub(last) >= threshold {
			m.Touched = now
			due = append(due, m)
		}
	}
	l.bucket.Each(pick)
	l.mu.Lock()
	for m := range l.inflight {
		pick(m)
	}
	l.mu.Unlock()
	for _, m := range due {
		if err := m.Acker.InProgress(); err != nil {
			l.log.Debug("in-progress ack failed", "msg_id", m.Key(), "err", err)
		}
	}
}
