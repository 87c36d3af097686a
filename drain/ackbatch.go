package drain

import (
	"context"
	"sync"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Acks of successful deliveries are sent in batches (issue 15). Sent one by
// one, every ack woke the NATS client's flusher, made one write and woke the
// server's reader of the connection and its ack processing: about 2.7 of the
// process's 7.3 context switches per message at 1,000/s, and a fifth of its
// CPU (docs/performance.md). Sent together, a batch costs one such round.
//
// An ack is fire-and-forget (sources.JetStream); holding it a few
// milliseconds changes nothing the server or the downstream can see, except
// that a crash in between redelivers those messages (at-least-once, G4; the
// idempotency key, G8; the consumer's own state is written only every
// ~100 ms anyway, NOTES.md). An ack that comes ackBatchDelay or more after
// the last one sent is sent at once: at such a rate (≤ 1/ackBatchDelay, 100/s)
// a batch would hold one ack, and its timer would add a wake-up instead of
// saving one. Otherwise the lane sends the batch:
//   - with the first ack added ackBatchDelay or more after the batch's
//     first, on the caller (a worker), in line;
//   - else ackBatchLate after the batch's first, from a timer: the last acks
//     of a burst. The timer used to send every batch at ackBatchDelay; its
//     callback runs on a new goroutine whose stack grows on the ack's path
//     (runtime.newstack → copystack: 17 % of the lane's CPU samples at
//     100/s, docs/performance.md), where a worker's stack is grown already;
//   - at once when it holds ackBatchMax acks,
//   - before every pull request (fetch.go), so that the server counts the
//     acked messages out of max_ack_pending before it serves the pull,
//   - at the end of Drain, before it returns (the caller then flushes and
//     closes the connection, case C19).
const (
	ackBatchDelay = 10 * time.Millisecond
	ackBatchLate  = 2 * ackBatchDelay
	ackBatchMax   = 256
)

// ackBatch holds the acks of one lane until they are sent together. Its
// methods are safe for concurrent use.
type ackBatch struct {
	mu    sync.Mutex
	q     []*shaper.Message
	spare []*shaper.Message // the slice of the last batch sent, for reuse
	timer *time.Timer
	armed bool                                         // the timer runs for the batch in q
	sent  time.Time                                    // when the last ack or batch was sent
	first time.Time                                    // when the batch's first ack was added
	send  func(ctx context.Context, m *shaper.Message) // sends one ack (Lane.sendAck)
}

// add queues m's ack at now (the clock read of the caller), or sends it
// at once when the last was sent ackBatchDelay or more ago and none waits;
// it sends the batch, m's ack last, when the batch's first ack is
// ackBatchDelay old or the batch is full.
func (b *ackBatch) add(m *shaper.Message, now time.Time) {
	b.mu.Lock()
	if len(b.q) == 0 && now.Sub(b.sent) >= ackBatchDelay {
		b.sent = now
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		b.send(ctx, m)
		cancel()
		return
	}
	if len(b.q) == 0 {
		b.first = now
	}
	b.q = append(b.q, m)
	due := len(b.q) >= ackBatchMax || now.Sub(b.first) >= ackBatchDelay
	if !due && !b.armed {
		b.armed = true
		armTimer(&b.timer, ackBatchLate, b.flush)
	}
	b.mu.Unlock()
	if due {
		b.flush()
	}
}

// flush sends every queued ack, in the order they were queued.
func (b *ackBatch) flush() {
	b.mu.Lock()
	q := b.q
	if len(q) == 0 {
		b.mu.Unlock()
		return
	}
	b.q, b.spare = b.spare[:0], nil
	b.sent = time.Now()
	if b.armed {
		b.armed = false
		b.timer.Stop()
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout) // one timer per batch
	for i, m := range q {
		b.send(ctx, m)
		q[i] = nil
	}
	cancel()
	b.mu.Lock()
	if b.spare == nil {
		b.spare = q[:0]
	}
	b.mu.Unlock()
}

// sendAck acks m at the source; a failure is logged (the downstream has the
// message: the server redelivers it after ack wait, and the idempotency key
// lets the downstream drop the copy, G8).
func (l *Lane) sendAck(ctx context.Context, m *shaper.Message) {
	if aerr := m.Acker.Ack(ctx); aerr != nil {
		l.log.Warn("ack failed", "msg_id", m.Key(), "err", aerr)
	}
}
