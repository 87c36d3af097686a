package drain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// fetchLoop fills the bucket from the source. In overflow mode "block" it
// fetches only into free slots (G6); in "reject" it keeps fetching and the
// bucket refuses what does not fit.
func (l *Lane) fetchLoop() {
	defer close(l.fetchDone)
	reject := l.conf().Bucket.Overflow == "reject"
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-l.fetchStop:
			return
		default:
		}
		capacity := l.bucket.Capacity()
		want := 0
		switch {
		case reject:
			want = min(capacity, 256)
		case l.bucket.Len() == 0 || l.bucket.Free() >= fetchLowWater(capacity):
			// Block mode: one pull per batch of freed slots, not one per
			// departure (a pull request costs an inbox, a subscription and
			// a JSON request); an empty bucket always asks at once.
			want = l.bucket.Reserve(capacity)
		}
		if want == 0 {
			select {
			case <-l.fetchStop:
				return
			case <-l.bucket.Freed():
			}
			continue
		}
		l.acks.flush() // before the pull: the server counts them out of max_ack_pending (ackbatch.go)
		got := 0
		err := l.src.Fetch(context.Background(), want, func(m *shaper.Message) {
			got++
			l.admit(m, !reject)
		})
		if !reject {
			l.bucket.Release(want - got)
		}
		if err != nil {
			l.log.Warn("fetch failed", "err", err, "retry_in", backoff)
			select {
			case <-l.fetchStop:
				return
			case <-time.After(backoff):
			}
			// At most 1 s: a consumer leader election on a cluster fails
			// the pulls ("no responders") for 4–8 s, and the lane must
			// resume within about a second of the new leader (issue 13,
			// docs/scaling.md).
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// fetchLowWater is how many slots must be free before a lane whose bucket
// still holds messages pulls again: a quarter of the capacity, at most 64.
// The messages still waiting cover the pull's round trip.
func fetchLowWater(capacity int) int { return max(1, min(capacity/4, 64)) }

// admit puts m into the bucket, or dead-letters it when it does not fit.
func (l *Lane) admit(m *shaper.Message, reserved bool) {
	l.notePayload(len(m.Data)) // the memory limit (memory.go)
	l.nudgeHouse()             // keepalive.go
	if m.NumDelivered > 1 {
		l.m.Redelivered.Inc()
	}
	if m.Invalid == "" && l.conf().Source.MaxMessageBytes > 0 && len(m.Data) > l.conf().Source.MaxMessageBytes {
		m.Invalid = fmt.Sprintf("payload of %d bytes exceeds source.max_message_bytes %d", len(m.Data), l.conf().Source.MaxMessageBytes)
	}
	if l.purged(m) { // an operator's purge (control.go)
		if reserved {
			l.bucket.Release(1)
		}
		l.purge(m)
		return
	}
	if l.holdNotDue(m, reserved) { // Shaper-Not-Before, Shaper-Deadline (timing.go)
		return
	}
	if m.Invalid != "" {
		if reserved {
			l.bucket.Release(1)
		}
		l.tasks.Add(1)
		go func() {
			defer l.tasks.Done()
			l.deadLetter(m, shaper.ReasonInvalid, errors.New(m.Invalid), notAttempted)
		}()
		return
	}
	now := time.Now()
	// Projected wait (reject mode): until the pacer's next departure (a
	// pause included), then what is ahead at the ramp's rate.
	l.mu.Lock()
	rate := l.pacer.RampRate(now)
	maxWait := l.conf().Bucket.MaxWait
	if first := l.pacer.Next(now).Sub(now); maxWait > 0 && first > 0 {
		maxWait -= first
		if maxWait <= 0 {
			maxWait = 1 // any wait exceeds it
			rate = 0
		}
	}
	l.mu.Unlock()
	wasEmpty, err := l.bucket.Admit(m, now, reserved, rate, maxWait)
	if err != nil {
		reason := shaper.ReasonOverflow
		if errors.Is(err, shaper.ErrMaxWait) {
			reason = shaper.ReasonMaxWait
		}
		l.tasks.Add(1)
		go func() {
			defer l.tasks.Done()
			l.deadLetter(m, reason, err, notAttempted)
		}()
		return
	}
	l.m.Admitted.Inc()
	l.m.BucketDepth.Set(float64(l.bucket.Len()))
	if wasEmpty {
		l.mu.Lock()
		l.pacer.SetBusy(now, true)
		l.mu.Unlock()
	}
}
