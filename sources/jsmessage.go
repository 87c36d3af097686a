package sources

import (
	"bytes"
	"context"
	"math"
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
// docs/BENCHMARKS.md (the heap profile is in docs/performance.md).
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
//     numbers are the message's own (three are in shaper.Message anyway, two
//     are packed into one word with the ack flag), so it is rebuilt when an
//     ack is sent. A subject of another form (the v2 form with a random
//     last token) or with numbers too large for that word is kept whole.
//   - the subject and the stream name are shared by a run of messages that
//     have the same ones.

// copyMax is the largest payload copied out of nats.go's buffer: Go's
// largest small-object size class (32 KiB). Up to it, the header block can
// move the buffer into a larger size class; above it, objects are whole
// 8 KiB pages, a header block costs at most one more page, and a copy would
// double the garbage of every message (the 512 KiB cell of section 5 peaked
// at 200 MiB RSS with copies, docs/performance.md).
const copyMax = 32 << 10

// jsMessage is a shaper.Message and its Acker in one allocation of 320
// bytes (a Go size class; 16 bytes more would take the next one, 352): the
// Message's Acker is the jsMessage itself.
type jsMessage struct {
	shaper.Message
	route *ackRoute
	// state is the consumer sequence and the pending count of the ack
	// subject and whether a final verb was sent, in one word (ackState).
	state atomic.Uint64
}

// ackRoute is where a message's acks go: the connection and the ack
// subject's prefix, shared by the messages of a fetch; or, for a subject
// that cannot be rebuilt, that whole subject (whole).
type ackRoute struct {
	nc      *nats.Conn
	subject string
	whole   bool
	held    *heldSeqs // the source's; nil outside Fetch (held.go)
}

// The bits of jsMessage.state: the consumer sequence in the top 40 (up to
// 1.1 × 10^12: 3.5 years of deliveries at 10,000/s), the pending count in
// the next 23 (up to 8.4 million), the done flag in the lowest. A message
// whose numbers do not fit keeps its whole ack subject instead (64–80
// bytes more).
const (
	ackPendingBits = 23
	ackSeqBits     = 40
	ackDone        = 1
)

// ackState packs cseq and pending, or reports false when they do not fit.
func ackState(cseq, pending uint64) (uint64, bool) {
	if cseq >= 1<<ackSeqBits || pending >= 1<<ackPendingBits {
		return 0, false
	}
	return cseq<<(ackPendingBits+1) | pending<<1, true
}

// ackNumbersOf unpacks ackState's word.
func ackNumbersOf(state uint64) (cseq, pending uint64) {
	return state >> (ackPendingBits + 1), state >> 1 & (1<<ackPendingBits - 1)
}

// shared holds what one fetch shares among its messages.
type shared struct {
	subject, stream string
	route           *ackRoute
	held            *heldSeqs // the source's (held.go)
}

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
	reply := msg.Reply()
	a, ok := parseAck(reply)
	if !ok { // another form: nats.go reads them all
		md, err := msg.Metadata()
		if err != nil {
			return nil, err
		}
		a = ackFields{stream: md.Stream, n: ackNumbers{md.NumDelivered, md.Sequence.Stream, md.Sequence.Consumer, uint64(md.Timestamp.UnixNano()), md.NumPending}}
		a.prefix, a.rebuilt = ackPrefix(reply, a.n)
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
			Stream:       intern(&sh.stream, a.stream, true),
			StreamSeq:    a.n[ackSeqStream],
			NumDelivered: a.n[ackDelivered],
			Published:    time.Unix(0, int64(a.n[ackTime])),
			Received:     received,
		},
	}
	jm.PackHeader(h)
	jm.Acker = jm
	var st uint64
	jm.route, st = sh.routeFor(nc, reply, a.prefix, a.rebuilt, a.n[ackSeqConsumer], a.n[ackPending])
	jm.state.Store(st)
	return &jm.Message, nil
}

// ackFields is what a message keeps of its ack subject's metadata (SPEC §3
// Retries reads the delivery count, Max age the timestamp).
type ackFields struct {
	stream string
	n      ackNumbers
	// prefix is the subject without its tail of numbers (ackPrefix), and
	// rebuilt whether prefix + appendTail(n) is the subject again.
	prefix  string
	rebuilt bool
}

// parseAck reads an ack subject of the two forms a message's ack route
// rebuilds (jsMessage.reply),
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//
// with its numbers written as appendTail writes them (decimal, no leading
// zero), in one pass and no allocation. Any other subject, such as the v2
// form with its last random token, reports false, and newMessage asks
// nats.go (jetstream.Msg.Metadata, which reads every form). Issue 15: nats.go's
// Metadata is an allocation and nine cuts of the subject, and ackPrefix built
// the tail again to compare it: 3–4 % of the CPU at full speed
// (docs/performance.md, throughput).
func parseAck(reply string) (a ackFields, ok bool) {
	const head = "$JS.ACK."
	if !strings.HasPrefix(reply, head) {
		return a, false
	}
	end := len(reply)
	for i := len(a.n) - 1; i >= 0; i-- {
		dot := strings.LastIndexByte(reply[:end], '.')
		if dot < len(head) {
			return a, false
		}
		x, good := decimal(reply[dot+1 : end])
		if !good {
			return a, false
		}
		a.n[i], end = x, dot
	}
	names := reply[len(head):end] // <stream>.<consumer>, or with <domain>.<account hash>. before them
	switch strings.Count(names, ".") {
	case 1:
	case 3:
		_, names, _ = strings.Cut(names, ".")
		_, names, _ = strings.Cut(names, ".")
	default:
		return a, false
	}
	stream, consumer, _ := strings.Cut(names, ".")
	if stream == "" || consumer == "" {
		return a, false
	}
	a.stream, a.prefix, a.rebuilt = stream, reply[:end], true
	return a, true
}

// decimal parses s as appendTail writes a number: digits, no leading zero
// but for 0 itself, no overflow.
func decimal(s string) (uint64, bool) {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	var x uint64
	for i := 0; i < len(s); i++ {
		d := uint64(s[i] - '0')
		if d > 9 || x > (math.MaxUint64-d)/10 {
			return 0, false
		}
		x = x*10 + d
	}
	return x, true
}

// routeFor returns the route of a message with ack subject reply and its
// packed state: the fetch's shared route when reply is its prefix and its
// numbers (rebuilt: see ackFields), whose consumer sequence and pending
// count are cseq and pending, and those two fit the state word; else a
// route of the whole subject, and state 0.
func (sh *shared) routeFor(nc *nats.Conn, reply, p string, rebuilt bool, cseq, pending uint64) (*ackRoute, uint64) {
	st, fits := ackState(cseq, pending)
	switch {
	case !fits || !rebuilt:
		return &ackRoute{nc: nc, subject: reply, whole: true, held: sh.held}, 0
	case sh.route == nil || sh.route.nc != nc || sh.route.subject != p:
		sh.route = &ackRoute{nc: nc, subject: strings.Clone(p), held: sh.held}
	}
	return sh.route, st
}

// ackNumbers are the last five tokens of an ack subject: delivery count,
// stream sequence, consumer sequence, timestamp (ns), pending.
type ackNumbers [5]uint64

// The indexes of ackNumbers.
const (
	ackDelivered = iota
	ackSeqStream
	ackSeqConsumer
	ackTime
	ackPending
)

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
	tail := appendTail(buf[:0], n)
	// Compared in place: string(tail) as a value would be allocated (it is
	// longer than the compiler's 32-byte stack buffer).
	if len(reply) < len(tail) || reply[len(reply)-len(tail):] != string(tail) {
		return reply, false
	}
	return reply[:len(reply)-len(tail)], true
}

// reply returns the message's ack subject.
func (jm *jsMessage) reply() string {
	if jm.route.whole {
		return jm.route.subject
	}
	var buf [len(ackNumbers{}) * 21]byte
	cseq, pending := ackNumbersOf(jm.state.Load())
	tail := appendTail(buf[:0], jm.numbers(cseq, pending))
	var b strings.Builder // one allocation; String does not copy
	b.Grow(len(jm.route.subject) + len(tail))
	b.WriteString(jm.route.subject)
	b.Write(tail)
	return b.String()
}

// The acknowledgements are the bodies nats.go's jetstream.Msg publishes to
// the message's ack subject (jetstream/message.go ackReply, nats.go v1.55 and v1.56:
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
	if jm.state.Load()&ackDone != 0 {
		return jetstream.ErrMsgAlreadyAckd
	}
	return jm.route.nc.Publish(jm.reply(), progressBody)
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
	st := jm.state.Load()
	if st&ackDone != 0 || !jm.state.CompareAndSwap(st, st|ackDone) {
		return jetstream.ErrMsgAlreadyAckd
	}
	// Sent or not, the lane holds the message no more after its final verb
	// (it does not retry a failed one): the server's redelivery of it must
	// be admitted again, else it would be refused for good (held.go).
	jm.route.held.settled(jm.StreamSeq)
	if err := jm.route.nc.Publish(jm.reply(), body); err != nil {
		jm.state.And(^uint64(ackDone)) // not sent: the verb may be tried again
		return err
	}
	return nil
}
