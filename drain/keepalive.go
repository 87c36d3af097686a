package drain

import (
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// houseLoop refreshes gauges and sends in-progress acks for every message the
// lane holds, before the server's ack wait runs out (SPEC G7).
func (l *Lane) houseLoop() {
	defer close(l.houseDone)
	ackWait := l.conf().Source.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	progressEvery := max(ackWait/4, 50*time.Millisecond)
	gauge := time.NewTicker(250 * time.Millisecond)
	defer gauge.Stop()
	progress := time.NewTicker(progressEvery)
	defer progress.Stop()
	for {
		select {
		case <-l.houseStop:
			l.flushDeadLetterLog(time.Now(), true) // the tasks are done: the last summary
			return
		case now := <-gauge.C:
			now = time.Now()
			l.mu.Lock()
			rate := l.pacer.Rate(now)
			paused := now.Before(l.pacer.PausedUntil())
			if _, held := l.holdUntil(now); held || l.quota.held { // quota.go
				paused, rate = true, 0
			}
			l.mu.Unlock()
			l.noteHoldEnd(now)
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
		case <-progress.C:
			l.touch(time.Now(), ackWait/2)
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
