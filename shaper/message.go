// Package shaper holds the semantics of a lane: the message model, the bounded
// bucket, the pacer (constant rate, slack, min_spacing make-up, warmup,
// pauses), expiry, dead-letter reasons and outcomes, and the parsing of
// rates. It imports the standard library only and performs no I/O: every
// rule here is a pure function of the instants passed in, tested as tables
// of instants and random schedules. The clock and the sleeping are the
// worker's (drain: the precise waiter).
package shaper

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Acker is the set of acknowledgement verbs a source gives each message. The
// verbs map one to one onto JetStream's (see nats.go jetstream.Msg): a lane
// never invents states of its own. Implementations must be safe for use by
// several goroutines; a verb after the message was already acknowledged returns
// an error and has no effect.
type Acker interface {
	// Ack reports success. It may return before the server has the ack:
	// the JetStream acker sends it fire-and-forget (a confirmed ack per
	// message caps a consumer near 30k/s, NOTES.md), so a nil error means
	// sent, not stored; the daemon flushes the connection before closing it
	// so that the acks of a drain reach the server (case C19), and an ack
	// lost in a crash is a redelivery with the same key (G8), never a loss.
	// ctx bounds the call where an implementation does wait.
	Ack(ctx context.Context) error
	// Nak asks for redelivery after delay (0 = at once). The delivery counter
	// of the message increases when it comes back.
	Nak(delay time.Duration) error
	// InProgress resets the server's ack-wait timer of the message (SPEC G7).
	InProgress() error
	// Term tells the server never to redeliver the message. Lanes call it only
	// after the message was dead-lettered (SPEC G4).
	Term(reason string) error
}

// Message is one job held by a lane, from admission to its final verb.
// Header follows the MIME convention of net/http and nats.Header (canonical
// keys are not required; lookups are exact).
type Message struct {
	// Subject is the subject the job was published to.
	Subject string
	// Header holds the job's headers as published. A source may keep them
	// packed instead while the message waits (PackHeader): then Header is
	// nil until the lane unpacks them at departure (UnpackHeader), and code
	// that runs before reads them with HeaderValue, HeaderValues or
	// HeaderMap. Sinks see Header set, except those that read headers
	// through these accessors only (drain.PackedHeaderReader).
	Header map[string][]string
	// Data is the payload, passed to the sink unchanged.
	Data []byte
	// Stream and StreamSeq locate the message in JetStream.
	Stream    string
	StreamSeq uint64
	// NumDelivered is the server's delivery count, 1 on the first delivery.
	NumDelivered uint64
	// Published is when the stream stored the message (its JetStream
	// timestamp); zero when unknown. bucket.max_age counts from it.
	//
	// A source may derive the message's acknowledgements from Stream,
	// StreamSeq, NumDelivered and Published (the JetStream source rebuilds
	// the ack subject from them, to keep less per queued message): the lane
	// never changes them.
	Published time.Time
	// Received is when the lane received the message from the server; the
	// server's ack-wait timer started shortly before it (SPEC G7).
	Received time.Time
	// Admitted is when the bucket accepted the message (queue wait starts).
	Admitted time.Time
	// Departed is when the message left the bucket (set by the lane).
	Departed time.Time
	// NotBefore and Deadline are its Shaper-Not-Before and Shaper-Deadline
	// (SPEC §3 Per-message control), read by the lane at admission
	// (TimingOf); zero when absent.
	NotBefore, Deadline time.Time
	// Invalid, when not empty, says why the source could not turn what it
	// received into a deliverable message; the lane dead-letters it with
	// reason "invalid" instead of admitting it.
	Invalid string
	// Touched is when the lane last sent an in-progress ack for the message;
	// it is owned by the lane's housekeeping goroutine.
	Touched time.Time
	// Acker carries the acknowledgement verbs; nil only in tests of pure logic.
	Acker Acker

	packed    string    // the headers while Header is nil (header.go)
	fairClass fairClass // set by a fair Bucket's Pop (FairClass)
}

// MsgIDHeader is the JetStream de-duplication header; when present it is the
// idempotency key of the message (SPEC G8).
const MsgIDHeader = "Nats-Msg-Id"

// KeyHeader carries a message's idempotency key (SPEC G8) on a dead letter,
// and on a replayed one (with ReplayOfHeader), where it keeps the original
// key: the replay's own Nats-Msg-Id must differ from the original's, or the
// stream's duplicate window would drop it.
const KeyHeader = "Shaper-Key"

// ReplayOfHeader marks a message republished by a replay of dead letters
// (SPEC §3 Operator control): the dead-letter stream's sequence of the dead
// letter it came from.
const ReplayOfHeader = "Shaper-Replay-Of"

// OrigMsgIDHeader carries, on a dead letter and on its replay, the
// Nats-Msg-Id the job was first published with: the dead letter and the
// replay travel under ids of their own, and the HTTP sink sends this one
// as X-Nats-Msg-Id, so a receiver sees the publisher's id on a replay too.
const OrigMsgIDHeader = "Shaper-Msg-Id"

// SubjectHeader carries a dead letter's original subject, so that a replay
// does not depend on the source stream still holding the message.
const SubjectHeader = "Shaper-Subject"

// Key returns the idempotency key of m, stable across redeliveries (SPEC G8):
// the Nats-Msg-Id header when present, else "<stream>:<stream sequence>". A
// replayed dead letter (ReplayOfHeader set) keeps its original key from
// KeyHeader, so the downstream can deduplicate it.
func (m *Message) Key() string {
	if _, ok := m.HeaderValue(ReplayOfHeader); ok {
		if v, _ := m.HeaderValue(KeyHeader); v != "" {
			return v
		}
	}
	if v, _ := m.HeaderValue(MsgIDHeader); v != "" {
		return v
	}
	return fmt.Sprintf("%s:%d", m.Stream, m.StreamSeq)
}

// ErrPermanent marks a sink failure that no retry can fix (for HTTP: a 4xx
// other than 408 and 429, or a status not listed as retryable). The lane
// dead-letters such a message at once with reason "rejected_by_sink".
var ErrPermanent = errors.New("shaper: permanent sink failure")

// SinkError describes a failed delivery attempt. Sinks return it (wrapped or
// not) so the worker can choose between retry, pause and dead letter.
type SinkError struct {
	// Status is the downstream's status code (HTTP status), 0 when none.
	Status int
	// RetryAfter is the delay the downstream asked for (HTTP Retry-After),
	// 0 when absent. It is already converted from seconds or an HTTP date.
	RetryAfter time.Duration
	// Saturated is true when the downstream said the whole service is busy
	// (HTTP 429 or 503): with a RetryAfter the lane pauses all departures.
	Saturated bool
	// Permanent is true when retrying cannot help; errors.Is(err,
	// ErrPermanent) then reports true.
	Permanent bool
	// Err is the underlying cause, if any.
	Err error
}

// Error implements error. It never includes the payload.
func (e *SinkError) Error() string {
	msg := "sink failure"
	if e.Status != 0 {
		msg = fmt.Sprintf("sink answered status %d", e.Status)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *SinkError) Unwrap() error { return e.Err }

// Is reports ErrPermanent for permanent failures.
func (e *SinkError) Is(target error) bool { return target == ErrPermanent && e.Permanent }
