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
	var failures int // consecutive failed pulls
	var failedSince, warned time.Time
	ask := minPull // the most the next pull asks for (nextPull)
	grow := false  // the last pull was cut to ask and came back full
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
			want = min(capacity, 256, ask)
		case grow || l.bucket.Len() == 0 || l.bucket.Free() >= fetchLowWater(capacity):
			// Block mode: one pull per batch of freed slots, not one per
			// departure (a pull request costs an inbox, a subscription and
			// a JSON request); an empty bucket always asks at once, and so
			// does a lane whose last pull was cut to the pull size and
			// came back full (nextPull).
			want = l.bucket.Reserve(min(capacity, ask))
		}
		if want == 0 {
			grow = false // the bucket is full
			select {
			case <-l.fetchStop:
				return
			case <-l.bucket.Freed():
			}
			continue
		}
		l.acks.flush() // before the pull: the server counts them out of max_ack_pending (ackbatch.go)
		got := 0
		l.burst.expect() // burst.go
		err := l.src.Fetch(context.Background(), want, func(m *shaper.Message) {
			got++
			l.burst.arrived(m.Received)
			l.admit(m, !reject)
		})
		l.burst.end()
		if !reject {
			l.bucket.Release(want - got)
		}
		grow = got == ask && err == nil
		ask = nextPull(got)
		if err != nil {
			now := time.Now()
			if failures == 0 {
				failedSince = now
			}
			failures++
			// One warning when pulls start failing, and one every
			// fetchWarnEvery while they go on; the others at debug level
			// (an election retries a few times a second).
			if failures == 1 || now.Sub(warned) >= fetchWarnEvery {
				warned = now
				l.log.Warn("fetch failed", "err", err, "retry_in", backoff, "failures", failures)
			} else {
				l.log.Debug("fetch failed", "err", err, "retry_in", backoff, "failures", failures)
			}
			select {
			case <-l.fetchStop:
				return
			case <-time.After(backoff):
			}
			// At most 1 s: a consumer leader election on a cluster fails
			// the pulls for 4–9 s, and the lane must resume within about a
			// second of the new leader (issue 13, docs/scaling.md). A pull
			// that found no leader at all (RetrySoon: "no responders",
			// answered at once by the server) is tried again within
			// noLeaderRetry, so that the lane resumes within a quarter of
			// a second of the election.
			backoff = min(2*backoff, time.Second)
			var soon interface{ RetrySoon() bool }
			if errors.As(err, &soon) && soon.RetrySoon() {
				backoff = min(backoff, noLeaderRetry)
			}
			continue
		}
		if failures > 0 {
			l.log.Info("fetch resumed", "failures", failures, "after", time.Since(failedSince).Round(time.Millisecond))
			failures = 0
		}
		backoff = 100 * time.Millisecond
	}
}

// noLeaderRetry caps the fetch back-off after a pull that found no one to
// serve it (a Source error with RetrySoon() true): the server answers such
// a pull at once, so trying four times a second costs nothing, and the lane
// resumes within noLeaderRetry of a new consumer leader.
const noLeaderRetry = 250 * time.Millisecond

// fetchWarnEvery is how often failing pulls are logged at warning level
// while they go on.
const fetchWarnEvery = 10 * time.Second

// minPull and nextPull size the pulls. A pull asks for at most
// max(minPull, twice what the last one brought), and for fewer when fewer
// slots are free (at most 256 with overflow "reject"): a pull that came
// back full doubles the next, so a lane fills its bucket from a backlog in
// a few round trips (minPull to 1,000 in 6; the loop pulls again at once
// after such a pull, below the low-water mark too), and a quiet lane asks
// for little. nats.go's Fetch allocates, for every pull, a channel of 16
// bytes per message asked for (v1.55 also one of 8 bytes for twice as
// many); a quiet lane renews its pull every sources.FetchExpiry, and asking
// for the whole free bucket (1,000 slots by default) made those channels
// most of an idle daemon's CPU: 32 KB a lane a second to allocate, zero and
// collect with v1.55 (perf, docs/performance.md, session 29).
const minPull = 32

func nextPull(got int) int { return max(minPull, 2*got) }

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
	// Admitted under l.mu: the departure loop pops the head and records
	// its departure in the pacer under it too (popDeliverable), so the
	// projected wait never sees the head gone with the pacer's next
	// departure not yet moved (it admitted one more than max_wait allows,
	// 31 of 600 runs of TestCase_C10_RejectOverflowByMaxWait).
	wasEmpty, err := l.bucket.Admit(m, now, reserved, rate, maxWait)
	if err == nil && wasEmpty {
		l.pacer.SetBusy(now, true)
	}
	l.mu.Unlock()
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
}
