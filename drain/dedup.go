package drain

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// dedupTimeout bounds one lookup or record of a delivered key: a store that
// does not answer within it counts as unreachable.
const dedupTimeout = 2 * time.Second

// WithDedup turns on delivered-key dedup (SPEC §3, sink.dedup_window): the
// key (G8) of every message the sink accepted is recorded in d after the
// sink call and before the ack; a message whose key d has seen is acked
// without a sink call, outcome duplicate_skipped. nil (the default) is off.
//
// A store that fails never costs a message (at-least-once, G4): a failed
// lookup delivers the message anyway, and a failed record still acks it
// (only a later duplicate goes unnoticed). Both are logged at warn level,
// at most once per failureLogEvery.
func WithDedup(d Dedup) Option {
	return optionFunc(func(l *Lane) { l.dedup.d = d })
}

// laneDedup is a lane's delivered-key store and the rate limit of its
// warnings.
type laneDedup struct {
	d     Dedup        // nil = off
	logAt atomic.Int64 // unix ns of the last warning
}

// skipDelivered reports whether m's key was already delivered (Dedup.Seen)
// and, if so, acks m without a sink call (outcome duplicate_skipped). The
// departure it took stays taken: the lookup runs in the task, off the
// departure loop, and a duplicate is rare (a redelivery after a crash).
func (l *Lane) skipDelivered(m *shaper.Message) bool {
	if l.dedup.d == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), dedupTimeout)
	seen, err := l.dedup.d.Seen(ctx, m.Key())
	cancel()
	if err != nil {
		l.warnDedup("delivered-key lookup failed: delivering anyway (at-least-once)", m, err)
		return false
	}
	if !seen {
		return false
	}
	l.breakerRecord(m, shaper.AttemptNeutral, nil, time.Now()) // a probe that made no call says nothing
	ctx, cancel = context.WithTimeout(context.Background(), ackTimeout)
	if err := m.Acker.Ack(ctx); err != nil {
		l.log.Warn("ack failed", "msg_id", m.Key(), "err", err)
	}
	cancel()
	l.m.Deliveries[shaper.OutcomeDuplicateSkipped].Inc()
	l.log.Debug("already delivered: acked without a sink call", "msg_id", m.Key(), "attempt", m.NumDelivered)
	return true
}

// recordDelivered records m's key as delivered (Dedup.Record), after the
// sink accepted m and before its ack: an ack lost in a crash then finds the
// key on redelivery. A crash between the sink's answer and the record still
// delivers the message again.
func (l *Lane) recordDelivered(m *shaper.Message) {
	if l.dedup.d == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dedupTimeout)
	err := l.dedup.d.Record(ctx, m.Key())
	cancel()
	if err != nil {
		l.warnDedup("delivered-key record failed: a redelivery of this message would be delivered again", m, err)
	}
}

func (l *Lane) warnDedup(what string, m *shaper.Message, err error) {
	now := time.Now().UnixNano()
	last := l.dedup.logAt.Load()
	if now-last < int64(failureLogEvery) || !l.dedup.logAt.CompareAndSwap(last, now) {
		l.log.Debug(what, "msg_id", m.Key(), "err", err)
		return
	}
	l.log.Warn(what, "msg_id", m.Key(), "err", err)
}
