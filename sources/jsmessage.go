package sources

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/shaper"
)

// What a queued message keeps (issue 15: memory per queued message).
//
// A lane holds up to bucket.capacity messages for as long as capacity/limit.
// Keeping nats.go's jetstream.Msg behind each one kept alive its nats.Msg
// (~112 bytes), its parsed header map (~450 bytes for one header: a Go map
// is a group of 8 slots) and the wrapper (32 bytes), on top of shaper's own
// Message: 1,343 heap bytes per queued 256-byte message in section 5 of
// docs/BENCHMARKS.md (the heap profile is in docs/performance-memory.md).
// A queued message now is, besides its payload, one allocation: jsMessage,
// the shaper.Message (headers packed into one string,
// shaper.Message.PackHeader) and the ack state. Three more things went:
//   - nats.go's buffer holds the header block in front of the payload; when
//     there is one and the payload is small (copyMax) it is copied out (the
//     headers are packed anyway), so that only the payload's own bytes stay:
//     256 instead of 320 heap bytes for a 256-byte payload with one header.
//   - the reply (ack) subject, ~55 bytes in a 64-byte allocation, is
//     $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>:
//     its prefix is the same for every message of a consumer and shared, the
//     numbers are the message's own (three are in shaper.Message anyway), so
//     it is rebuilt when an ack is sent. A subject of another form (the v2
//     form with a random last token) is kept whole.
//   - the subject and the stream name are shared by a run of messages that
//     have the same ones.

// copyMax is the largest payload copied out of nats.go's buffer: Go's
// largest small-object size class (32 KiB). Up to it, the header block can
// move the buffer into a larger size class; above it, objects are whole
// 8 KiB pages, a header block costs at most one more page, and a copy would
// double the garbage of every message (the 512 KiB cell of section 5 peaked
// at 200 MiB RSS with copies, docs/performance-memory.md).
const copyMax = 32 << 10

// jsMessage is a shaper.Message and its Acker in one allocation: the
// Message's Acker is the jsMessage itself.
type jsMessage struct {
	shaper.Message
	// prefix is the ack subject up to the delivery count (shared), or the
	// whole ack subject when whole is set.
	prefix        string
	cseq, pending uint64 // the consumer sequence and pending count of the ack subject
	nc            *nats.Conn
	done          atomic.Bool // Ack, Nak or Term sent
	whole         bool
}

// shared holds the strings one fetch shares among its messages.
type shared struct{ subject, stream, prefix string }

// intern returns s, or the equal string *last when there is one, else a
// copy of s that it keeps in *last (a copy, so that s's memory — a
// substring of nats.go's ack subject — can go).
func intern(last *string, s string, clone bool) string {
	if s == *last {
		return *last
	}
	if clone {
		s = strings.Clone(s)
	}
	*last = s
	return s
}

// newMessage builds the lane's message from msg (the delivery of a pull
// request), sharing strings with the earlier messages of the fetch through
// sh. It fails when the reply subject carries no JetStream metadata.
func newMessage(msg jetstream.Msg, nc *nats.Conn, sh *shared, received time.Time) (*shaper.Message, error) {
	md, err := msg.Metadata()
	if err != nil {
		return nil, err
	}
	h := msg.Headers()
	data := msg.Data()
	if len(h) > 0 && len(data) <= copyMax {
		data = bytes.Clone(data) // leave the header block behind (see above)
	}
	jm := &jsMessage{
		Message: shaper.Message{
			Subject:      intern(&sh.subject, msg.Subject(), false), // nats.go's own string
			Data:         data,
			Stream:       intern(&sh.stream, md.Stream, true),
			StreamSeq:    md.Sequence.Stream,
			NumDelivered: md.NumDelivered,
			Published:    md.Timestamp,
			Received:     received,
		},
		nc: nc,
	}
	jm.PackHeader(h)
	jm.Acker = jm
	reply := msg.Reply()
	if p, ok := ackPrefix(reply, jm.numbers(md.Sequence.Consumer, md.NumPending)); ok {
		jm.prefix, jm.cseq, jm.pending = intern(&sh.prefix, p, true), md.Sequence.Consumer, md.NumPending
	} else {
		jm.prefix, jm.whole = reply, true
	}
	return &jm.Message, nil
}

// ackNumbers are the last five tokens of an ack subject: delivery count,
// stream sequence, consumer sequence, timestamp (ns), pending.
type ackNumbers [5]uint64

func (jm *jsMessage) numbers(cseq, pending uint64) ackNumbers {
	return ackNumbers{jm.NumDelivered, jm.StreamSeq, cseq, uint64(jm.Published.UnixNano()), pending}
}

// appendTail appends ".<delivered>.<sseq>.<cseq>.<tm>.<pending>", the end
// of the ack subject (nats-server consumer.go ackReply, both forms), to b.
func appendTail(b []byte, n ackNumbers) []byte {
	for _, x := range n {
		b = strconv.AppendUint(append(b, '.'), x, 10)
	}
	return b
}

// ackPrefix returns reply without its tail of numbers n, and whether reply
// ends with exactly that tail: then prefix + the tail of n is reply again.
// A reply of another form (a token after the numbers, as the v2 form may
// get, or numbers written otherwise) reports false and is kept whole.
func ackPrefix(reply string, n ackNumbers) (string, bool) {
	var buf [len(n) * 21]byte
	return strings.CutSuffix(reply, string(appendTail(buf[:0], n)))
}

// reply returns the message's ack subject.
func (jm *jsMessage) reply() string {
	if jm.whole {
		return jm.prefix
	}
	var buf [len(ackNumbers{}) * 21]byte
	return jm.prefix + string(appendTail(buf[:0], jm.numbers(jm.cseq, jm.pending)))
}

// The acknowledgements are the bodies nats.go's jetstream.Msg publishes to
// the message's ack subject (jetstream/message.go ackReply, nats.go v1.55:
// "+ACK", "-NAK", `-NAK {"delay": <ns>}`, "+WPI", "+TERM <reason>"),
// fire-and-forget as Msg.Ack sends them. Keeping these few bytes instead of
// the jetstream.Msg is what lets its nats.go structures go (see above).
// Like jetstream.Msg, a verb after Ack, Nak or Term fails with
// jetstream.ErrMsgAlreadyAckd; InProgress may be sent any number of times.
var (
	ackBody      = []byte("+ACK")
	nakBody      = []byte("-NAK")
	progressBody = []byte("+WPI")
)

// Ack is fire-and-forget (a DoubleAck per message caps a consumer near
// 30k/s, NOTES.md); the daemon flushes the connection before it closes, so
// the acks of a drain reach the server (case C19).
func (jm *jsMessage) Ack(context.Context) error { return jm.final(ackBody) }

// Nak asks for redelivery after delay, at once when delay ≤ 0.
func (jm *jsMessage) Nak(delay time.Duration) error {
	if delay <= 0 {
		return jm.final(nakBody)
	}
	return jm.final(append(strconv.AppendInt([]byte(`-NAK {"delay": `), delay.Nanoseconds(), 10), '}'))
}

// InProgress resets the server's ack-wait timer of the message (SPEC G7).
func (jm *jsMessage) InProgress() error {
	if jm.done.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	return jm.nc.Publish(jm.reply(), progressBody)
}

// Term tells the server never to redeliver the message; reason appears in
// the server's advisory.
func (jm *jsMessage) Term(reason string) error {
	if reason == "" {
		return jm.final([]byte("+TERM"))
	}
	return jm.final(append([]byte("+TERM "), reason...))
}

// final publishes a verb that ends the message's acknowledgement, once.
func (jm *jsMessage) final(body []byte) error {
	if !jm.done.CompareAndSwap(false, true) {
		return jetstream.ErrMsgAlreadyAckd
	}
	if err := jm.nc.Publish(jm.reply(), body); err != nil {
		jm.done.Store(false) // not sent: the verb may be tried again
		return err
	}
	return nil
}
