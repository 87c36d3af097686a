package drain

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// The lane's breaker (SPEC §3 Breaker): the rule is shaper.Breaker, a pure
// state machine; this file connects it to the departure loop (a gate before
// each departure, which lets only the probe through while open), to the
// tasks (each attempt's outcome, attemptOf) and to the pacer (Hold: an open
// lane cools, so that it resumes through the warmup ramp, with no burst,
// SPEC G2). While open, nothing held is nak'd: the bucket keeps its
// messages with in-progress acks (keepalive.go), fetching stops when it is
// full, and the backlog waits in the stream; no delivery is spent but the
// probe's.

// laneBreaker is the breaker state of a lane, guarded by Lane.mu.
type laneBreaker struct {
	b     *shaper.Breaker
	probe *shaper.Message // the probe in flight; nil when none
}

func breakerConfig(cfg config.Lane) shaper.BreakerConfig {
	b := cfg.Task.Breaker
	return shaper.BreakerConfig{FailureRatio: b.FailureRatio, MinAttempts: b.MinAttempts, Window: b.Window, ProbeEvery: b.ProbeEvery}
}

// attemptOf classifies a finished attempt for the breaker (SPEC §3 Breaker:
// a network error, a timeout and a 5xx fail). err is the sink's result (nil
// = delivered), timedOut whether the task timeout ended it.
//   - AttemptFailure: the task timeout; a 5xx; a failure with no status that
//     is not permanent (a network error, a refused or reset connection, a
//     NATS publish that got no ack).
//   - AttemptGone: a 410 Gone.
//   - AttemptNeutral: any other 4xx (400, 404, 408, 409, 429, …) and any
//     other permanent failure: the downstream answered, about this message
//     or about the pace (429 and 503 with Retry-After pause the lane
//     already, SPEC §3 Retries), which says nothing about whether it is up.
//     Counting them as successes would let a run of bad messages hide a
//     failing downstream; as failures, open a healthy one. A probe that ends
//     so keeps the breaker open until the next probe.
//   - AttemptSuccess: delivered.
func attemptOf(err error, timedOut bool) shaper.Attempt {
	if err == nil {
		return shaper.AttemptSuccess
	}
	if timedOut {
		return shaper.AttemptFailure
	}
	var se *shaper.SinkError
	status := 0
	if errors.As(err, &se) {
		status = se.Status
	}
	switch {
	case status == http.StatusGone:
		return shaper.AttemptGone
	case status >= 500 && status <= 599:
		return shaper.AttemptFailure
	case status != 0, errors.Is(err, shaper.ErrPermanent):
		return shaper.AttemptNeutral
	}
	return shaper.AttemptFailure
}

// awaitBreaker is the departure loop's gate: it returns at once while the
// breaker is closed, and while it is open waits until a probe may leave
// (Lane.breakerDeparts makes the next departure the probe), or, held, until
// ResetBreaker. waited reports whether it waited (the loop then re-reads
// its clock, so the wait earns no credit beyond the slack, SPEC G2); ok is
// false when ctx ended. now is the loop's clock, read after its last wait
// (one clock read fewer per departure: issue 15).
func (l *Lane) awaitBreaker(ctx context.Context, now time.Time) (waited, ok bool) {
	for {
		if waited {
			now = time.Now()
		}
		l.mu.Lock()
		wait, until := l.brk.b.Gate(now)
		l.mu.Unlock()
		if !wait {
			return waited, true
		}
		waited = true
		if until.IsZero() { // held, or a probe in flight: until a change wakes the loop
			until = now.Add(time.Hour)
		}
		// Through the waiter, never by reading l.wake here: the precise
		// waiter's watcher goroutine takes the tokens of l.wake and keeps
		// them for its next Wait (a select here lost the wake of a probe's
		// end, and the lane stayed open with no probes).
		if _, err := l.waiter.Wait(ctx, until, l.wake); err != nil {
			return waited, false
		}
	}
}

// breakerDeparts records m's departure at now with the breaker, making m the
// probe when one is due. The caller holds l.mu.
func (l *Lane) breakerDeparts(m *shaper.Message, now time.Time) {
	if l.brk.b.Depart(now) {
		l.brk.probe = m
	}
}

// breakerRecord records the end of m's attempt with the breaker and carries
// out a change of state: the pacer's hold, the gauge, one log line, and a
// wake of the departure loop.
func (l *Lane) breakerRecord(m *shaper.Message, a shaper.Attempt, err error, now time.Time) {
	l.mu.Lock()
	probe := l.brk.probe == m
	if probe {
		l.brk.probe = nil
	}
	was := l.brk.b.State()
	st, changed := l.brk.b.Record(now, a, probe)
	attempts, failures := l.brk.b.Counts(now)
	openedAt := l.brk.b.OpenedAt()
	if changed {
		l.syncPacerHold(now)
	}
	cfg := l.brk.b.Config()
	l.mu.Unlock()
	if probe && !changed {
		l.log.Debug("breaker probe did not close it", "msg_id", m.Key(), "attempt", a.String(), "err", err,
			"next_probe_in", cfg.ProbeEvery)
	}
	if !changed && !probe {
		return
	}
	if changed {
		switch st {
		case shaper.BreakerOpen:
			l.log.Warn("breaker opened: departures stop, messages wait in the bucket and the stream; one probe every probe_every",
				"failed_attempts", failures, "attempts", attempts, "failure_share", float64(failures)/float64(max(attempts, 1)),
				"failure_ratio", cfg.FailureRatio, "window", cfg.Window, "probe_every", cfg.ProbeEvery, "last_err", err)
		case shaper.BreakerHeld:
			l.log.Error("breaker held open: the downstream answered 410 Gone; departures wait for an operator's resume (shaper resume LANE), with no probes",
				"msg_id", m.Key(), "was", was.String())
		case shaper.BreakerClosed:
			l.log.Info("breaker closed by a successful probe: departures resume through the warmup ramp",
				"open_for", now.Sub(openedAt).Round(time.Millisecond), "msg_id", m.Key())
		}
		l.setBreakerGauge(st)
	}
	l.wakeLoop()
}

// ResetBreaker closes the lane's breaker, open or held (SPEC §3 Breaker: an
// operator's resume ends a 410's hold; the admin API's resume calls it). The
// lane resumes through the warmup ramp, from the warmth it cooled to while
// open, with no burst (SPEC G2). It reports whether the breaker was open or
// held; on a closed breaker it does nothing and reports false. Safe for
// concurrent use.
func (l *Lane) ResetBreaker() bool {
	now := time.Now()
	l.mu.Lock()
	openedAt := l.brk.b.OpenedAt()
	was := l.brk.b.State()
	changed := l.brk.b.Reset(now)
	if changed {
		l.syncPacerHold(now)
	}
	l.mu.Unlock()
	if !changed {
		return false
	}
	l.log.Info("breaker closed by an operator's resume: departures resume through the warmup ramp",
		"was", was.String(), "open_for", now.Sub(openedAt).Round(time.Millisecond))
	l.setBreakerGauge(shaper.BreakerClosed)
	l.wakeLoop()
	return true
}

// BreakerState returns the state of the lane's breaker (SPEC §3 Breaker):
// closed, open (probing every probe_every) or held (after a 410 Gone, until
// ResetBreaker). Safe for concurrent use.
func (l *Lane) BreakerState() shaper.BreakerState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.brk.b.State()
}

// BreakerOpen reports whether the lane's breaker is open (departures stopped
// but for probes), and held whether it is held open after a 410 Gone, with
// no probes, until ResetBreaker. Safe for concurrent use.
func (l *Lane) BreakerOpen() (open, held bool) {
	st := l.BreakerState()
	return st != shaper.BreakerClosed, st == shaper.BreakerHeld
}

// updateBreaker applies a reloaded task.breaker in place (Update); turning
// the breaker off closes it. The caller wakes the departure loop.
func (l *Lane) updateBreaker(cfg config.Lane, now time.Time) {
	l.mu.Lock()
	closed := l.brk.b.SetConfig(breakerConfig(cfg), now)
	if closed {
		l.syncPacerHold(now)
	}
	l.mu.Unlock()
	if closed {
		l.log.Info("breaker closed: turned off by a reload (task.breaker.failure_ratio 0)")
		l.setBreakerGauge(shaper.BreakerClosed)
	}
}

func (l *Lane) setBreakerGauge(st shaper.BreakerState) {
	v := 0.0
	if st != shaper.BreakerClosed {
		v = 1
	}
	l.m.BreakerOpen.Set(v)
	if v == 1 {
		l.m.RateLimit.Set(0)
	}
}

// wakeLoop interrupts the departure loop's wait so that it reads the breaker
// and the pacer again.
func (l *Lane) wakeLoop() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}
