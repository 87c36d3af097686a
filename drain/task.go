package drain

import (
	"context"
	"errors"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// ackTimeout bounds the wait for an ack, nak or dead-letter publish.
const ackTimeout = 5 * time.Second

// runTask makes one delivery attempt under the task timeout and settles it.
// It returns when the attempt ended (the worker's idle clock).
func (l *Lane) runTask(m *shaper.Message) (end time.Time) {
	defer func() {
		l.mu.Lock()
		delete(l.inflight, m)
		if l.unwired == m {
			l.unwired = nil
		}
		delete(l.ot.set, m) // overtaken, and ended before its gate (gate.go)
		l.mu.Unlock()
		if l.gatesWire {
			notify(l.ot.taskEnded) // a drain's departure loop waits for the last one
		}
		l.m.InFlight.Dec()
		l.slots.release()
		l.tasks.Done()
	}()
	sink := l.sinkp.Load()
	if !sink.packed {
		// The sink reads m.Header: unpack what the source packed (the task owns m).
		m.UnpackHeader()
	}
	if l.skipDelivered(m) { // sink.dedup_window (dedup.go)
		return time.Now()
	}
	// One clock read for the deadline and the task's duration; the deadline's
	// context.WithDeadline is made only when a sink looks (taskctx.go).
	start := time.Now()
	tctx := newTaskContext(start.Add(l.conf().Task.Timeout))
	var ctx context.Context = tctx
	if l.reportsWire { // only a WireReporter calls it (a closure and a context value per task otherwise)
		var g *taskGate // its hold for min spacing goes with the report (wired)
		ctx = shaper.WithWire(ctx, func(t time.Time, exact bool) { l.wired(m, g, t, exact) })
		// A task released a lead before m.Departed waits for it at the
		// write (gate.go); at every rate an overtaken request waits there
		// for a departure of its own.
		if l.gatesWire {
			g = &taskGate{l: l, m: m, ctx: ctx, early: start.Before(m.Departed)}
			ctx = shaper.WithGate(ctx, g)
		}
	}
	ctx = l.withRateLimitReport(ctx) // rate.adaptive.headers (adaptive.go)
	err := sink.s.Send(ctx, m)
	end = time.Now()
	took := end.Sub(start)
	timedOut := err != nil && (errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil)
	tctx.end(end)
	switch {
	case err == nil:
		l.m.TaskDuration[shaper.OutcomeSuccess].Observe(took.Seconds())
	case timedOut:
		l.m.TaskDuration[shaper.OutcomeTimeout].Observe(took.Seconds())
	default:
		l.m.TaskDuration[shaper.OutcomeError].Observe(took.Seconds())
	}
	l.settle(m, err, timedOut, end)
	return end
}

// settle gives m its final verb for this attempt (SPEC §3, Retries); now
// is when the attempt ended (one clock read for the breaker, the adaptive
// rate and the ack batch: issue 15, CPU per message).
func (l *Lane) settle(m *shaper.Message, err error, timedOut bool, now time.Time) {
	l.breakerRecord(m, attemptOf(err, timedOut), err, now)
	l.adaptRecord(err, now) // rate.adaptive (adaptive.go)
	if err == nil {
		l.recordDelivered(m) // before the ack (dedup.go)
		l.acks.add(m, now)   // sent with others (ackbatch.go)
		l.delivered.Add(1)
		l.m.Deliveries[shaper.OutcomeSuccess].Inc()
		return
	}
	l.lastErr.Store(truncate(err.Error(), 512))
	cfg := l.conf()
	// Holds of a Shaper-Not-Before are deliveries, not attempts (timing.go).
	v := decide(err, timedOut, shaper.DeliveryAttempt(m), cfg.Source, cfg.Task.Retry)
	if v.kind == verdictDeadLetter {
		if l.deadLetter(m, v.reason, err, v.status) {
			l.m.Deliveries[shaper.OutcomeDeadLetter].Inc()
		} else {
			l.m.Deliveries[shaper.OutcomeRetry].Inc()
		}
		return
	}
	if v.pause {
		// The downstream is saturated: pause the whole lane (SPEC §3).
		l.Pause(now.Add(v.delay))
	}
	l.log.Debug("attempt failed", "msg_id", m.Key(), "attempt", m.NumDelivered, "status", v.status, "err", err, "retry_in", v.delay)
	l.warnFailures(m, v.status, err, v.delay)
	l.m.Deliveries[shaper.OutcomeRetry].Inc()
	l.nak(m, v.delay, v.reason)
}

// failureLogEvery bounds the warnings about failing attempts: one line per
// lane per period, with how many failed since the last one.
const failureLogEvery = 10 * time.Second

// warnFailures logs failing attempts at warn level, at most once per
// failureLogEvery, so that an operator sees a hanging or failing downstream in
// the logs without one line per message.
func (l *Lane) warnFailures(m *shaper.Message, status int, err error, delay time.Duration) {
	n := l.failures.Add(1)
	now := time.Now().UnixNano()
	last := l.failureLogAt.Load()
	if now-last < int64(failureLogEvery) || !l.failureLogAt.CompareAndSwap(last, now) {
		return
	}
	l.failures.Add(-n)
	l.log.Warn("delivery attempts failing; messages are retried", "failed_attempts", n,
		"last_status", status, "last_err", err, "msg_id", m.Key(), "retry_in", delay)
}

func (l *Lane) nak(m *shaper.Message, delay time.Duration, reason string) {
	if err := m.Acker.Nak(delay); err != nil {
		l.log.Warn("nak failed", "msg_id", m.Key(), "err", err)
	}
	l.nacked.Add(1)
	l.m.Retries[reason].Inc()
}
