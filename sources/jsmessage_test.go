package sources

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/shaper"
)

// TestJSMessageCompact (issue 15): what newMessage keeps of a delivery
// reads as the delivery did — the ack subject rebuilt from the shared
// prefix and the numbers equals the server's (kept whole when it has
// another form, the v2 ack subject), the headers, the payload without the
// header block in front of it (copied to its own bytes), stream and
// subject shared along the fetch — and its acks reach the server: after
// Ack nothing is pending, and a second verb is refused.
func TestJSMessageCompact(t *testing.T) {
	for _, tc := range []struct {
		name  string
		v2    bool
		whole bool
	}{
		{"ack subject v1", false, false},
		{"ack subject v2", true, false}, // nats-server 2.14 writes no token after the numbers
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := testJetStream(t, func(o *server.Options) {
				o.FeatureFlags = map[string]bool{server.FeatureFlagJsAckFormatV2: tc.v2}
			})
			nc := js.Conn()
			ctx := context.Background()
			if err := EnsureStream(ctx, js, "COMPACT", []string{"compact.>"}); err != nil {
				t.Fatal(err)
			}
			payload := []byte(strings.Repeat("p", 256))
			for i := range 3 {
				hdr := nats.Header{shaper.MsgIDHeader: {"job-" + strconv.Itoa(i)}, "Multi": {"a", "b"}}
				if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "compact.x", Data: payload, Header: hdr}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := js.Publish(ctx, "compact.x", payload); err != nil { // no headers
				t.Fatal(err)
			}
			large := []byte(strings.Repeat("L", copyMax+1)) // not copied: whole pages anyway
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "compact.x", Data: large, Header: nats.Header{"K": {"v"}}}); err != nil {
				t.Fatal(err)
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, "COMPACT", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				t.Fatal(err)
			}
			batch, err := cons.Fetch(5, jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			var sh shared
			var got []*shaper.Message
			for msg := range batch.Messages() {
				m, err := newMessage(msg, nc, &sh, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				jm := m.Acker.(*jsMessage)
				if r := jm.reply(); r != msg.Reply() {
					t.Errorf("rebuilt ack subject %q, want %q", r, msg.Reply())
				}
				if jm.route.whole != tc.whole {
					t.Errorf("ack subject kept whole: %v, want %v (%q)", jm.route.whole, tc.whole, msg.Reply())
				}
				if !slices.Equal(m.Data, msg.Data()) || len(m.Data) != len(payload) && len(m.Data) != len(large) {
					t.Errorf("payload of %d bytes", len(m.Data))
				}
				// nats.go's buffer holds the header block, then the payload:
				// a payload sliced from it keeps the header bytes alive.
				want := len(msg.Headers()) > 0 && len(msg.Data()) <= copyMax
				if copied := unsafe.SliceData(m.Data) != unsafe.SliceData(msg.Data()); copied != want {
					t.Errorf("payload of %d bytes copied: %v, want %v (only a small one with a header block in front)", len(m.Data), copied, want)
				}
				if !maps.EqualFunc(m.HeaderMap(), map[string][]string(msg.Headers()), slices.Equal) {
					t.Errorf("headers %q, want %q", m.HeaderMap(), msg.Headers())
				}
				if m.Header != nil {
					t.Error("headers not packed")
				}
				if m.Stream != "COMPACT" || m.StreamSeq == 0 || m.NumDelivered != 1 || m.Published.IsZero() {
					t.Errorf("metadata %q %d %d %v", m.Stream, m.StreamSeq, m.NumDelivered, m.Published)
				}
				// Read in one pass (parseAck) as nats.go reads it.
				md, err := msg.Metadata()
				if err != nil {
					t.Fatal(err)
				}
				cseq, pending := ackNumbersOf(jm.state.Load())
				if m.Stream != md.Stream || m.StreamSeq != md.Sequence.Stream || m.NumDelivered != md.NumDelivered ||
					!m.Published.Equal(md.Timestamp) || cseq != md.Sequence.Consumer || pending != md.NumPending {
					t.Errorf("metadata %q %d %d %v %d %d, nats.go's %+v", m.Stream, m.StreamSeq, m.NumDelivered, m.Published, cseq, pending, md)
				}
				got = append(got, m)
			}
			if len(got) != 5 {
				t.Fatalf("fetched %d, want 5", len(got))
			}
			if !sameString(got[0].Stream, got[3].Stream) || !sameString(got[0].Subject, got[3].Subject) ||
				got[0].Acker.(*jsMessage).route != got[3].Acker.(*jsMessage).route {
				t.Error("stream, subject or ack route not shared along the fetch")
			}
			for _, m := range got {
				if err := m.Acker.InProgress(); err != nil {
					t.Fatal(err)
				}
				if err := m.Acker.Ack(ctx); err != nil {
					t.Fatal(err)
				}
				if err := m.Acker.Ack(ctx); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
					t.Errorf("second Ack: %v, want ErrMsgAlreadyAckd", err)
				}
				if err := m.Acker.InProgress(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
					t.Errorf("InProgress after Ack: %v, want ErrMsgAlreadyAckd", err)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				info, err := cons.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.NumAckPending == 0 && info.AckFloor.Stream == 5 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 5 acks: %d pending, ack floor %d; the acks did not reach the server", info.NumAckPending, info.AckFloor.Stream)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// sameString reports whether a and b are the same string in memory, not
// only equal.
func sameString(a, b string) bool {
	return a == b && unsafe.StringData(a) == unsafe.StringData(b)
}

// TestAckPrefix: only an ack subject that ends with exactly the message's
// numbers is cut (and rebuilt from them); any other form is kept whole.
func TestAckPrefix(t *testing.T) {
	n := ackNumbers{2, 17, 5, 1764600000000000001, 9}
	for _, tc := range []struct {
		reply, prefix string
		ok            bool
	}{
		{"$JS.ACK.S.c.2.17.5.1764600000000000001.9", "$JS.ACK.S.c", true},
		{"$JS.ACK._.hash.S.c.2.17.5.1764600000000000001.9", "$JS.ACK._.hash.S.c", true},
		{"$JS.ACK._.hash.S.c.2.17.5.1764600000000000001.9.rnd", "", false}, // a token after the numbers
		{"$JS.ACK.S.c.2.17.5.1764600000000000001.09", "", false},           // a number written otherwise
		{"$JS.ACK.S.c.3.17.5.1764600000000000001.9", "", false},            // another delivery count
	} {
		p, ok := ackPrefix(tc.reply, n)
		if ok != tc.ok || ok && p != tc.prefix {
			t.Errorf("ackPrefix(%q) = %q, %v; want %q, %v", tc.reply, p, ok, tc.prefix, tc.ok)
		}
		if ok && p+string(appendTail(nil, n)) != tc.reply {
			t.Errorf("%q not rebuilt", tc.reply)
		}
	}
}

// TestParseAck: the two forms an ack route rebuilds are read in one pass
// as nats.go reads them, with the prefix ackPrefix cuts; every other
// subject is left to nats.go (jetstream.Msg.Metadata). The reference is the
// form's definition, token by token (nats.go internal/parser, v1.55 and v1.56).
func TestParseAck(t *testing.T) {
	n := ackNumbers{2, 17, 5, 1764600000000000001, 9}
	for _, tc := range []struct {
		reply, stream, prefix string
		ok                    bool
	}{
		{"$JS.ACK.S.c.2.17.5.1764600000000000001.9", "S", "$JS.ACK.S.c", true},
		{"$JS.ACK._.hash.ORDERS.c.2.17.5.1764600000000000001.9", "ORDERS", "$JS.ACK._.hash.ORDERS.c", true},
		{"$JS.ACK.dom.hash.S.c.2.17.5.1764600000000000001.9.rnd", "", "", false}, // the v2 form's last token
		{"$JS.ACK.dom.hash.S.c.2.17.5.1764600000000000001.9.123", "", "", false}, // a last token of digits
		{"$JS.ACK.S.c.2.17.5.1764600000000000001.09", "", "", false},             // a number written otherwise
		{"$JS.ACK.S.c.2.17.5.1764600000000000001.", "", "", false},               // an empty number
		{"$JS.ACK.S.c.2.17.5.18446744073709551616.9", "", "", false},             // above uint64
		{"$JS.ACK.S.c.2.17.5.1x.9", "", "", false},                               // not a number
		{"$JS.ACK.x.S.c.2.17.5.1764600000000000001.9", "", "", false},            // 10 tokens: neither form
		{"$JS.ACK.S.2.17.5.1764600000000000001.9", "", "", false},                // 8 tokens
		{"$JS.ACK..c.2.17.5.1764600000000000001.9", "", "", false},               // no stream
		{"_INBOX.x.S.c.2.17.5.1764600000000000001.9", "", "", false},             // not an ack subject
		{"", "", "", false},
	} {
		a, ok := parseAck(tc.reply)
		if ok != tc.ok {
			t.Errorf("parseAck(%q) ok = %v, want %v", tc.reply, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if a.stream != tc.stream || a.prefix != tc.prefix || !a.rebuilt || a.n != n {
			t.Errorf("parseAck(%q) = %+v; want stream %q, prefix %q, numbers %v", tc.reply, a, tc.stream, tc.prefix, n)
		}
		if p, ok := ackPrefix(tc.reply, a.n); !ok || p != a.prefix {
			t.Errorf("parseAck(%q): prefix %q, ackPrefix's %q", tc.reply, a.prefix, p)
		}
	}
	if a := testing.AllocsPerRun(100, func() { _, _ = parseAck("$JS.ACK.STREAM.consumer.2.123456.123450.1764600000000000001.4321") }); a != 0 {
		t.Errorf("parseAck: %v allocations, want 0", a)
	}
}

// TestAckSubjectAllocations (issue 15, the throughput row): cutting the
// ack subject at admission allocates nothing, and rebuilding it for the ack
// allocates only the subject.
func TestAckSubjectAllocations(t *testing.T) {
	// A tail longer than 32 bytes, as most are: a shorter string(tail) the
	// compiler could keep on the stack.
	n := ackNumbers{2, 123456, 123450, 1764600000000000001, 4321}
	reply := "$JS.ACK.STREAM.consumer.2.123456.123450.1764600000000000001.4321"
	if a := testing.AllocsPerRun(100, func() { _, _ = ackPrefix(reply, n) }); a != 0 {
		t.Errorf("ackPrefix: %v allocations, want 0", a)
	}
	jm := &jsMessage{Message: shaper.Message{NumDelivered: 2, StreamSeq: 123456, Published: time.Unix(0, 1764600000000000001)}}
	st, _ := ackState(123450, 4321)
	jm.state.Store(st)
	jm.route = &ackRoute{subject: "$JS.ACK.STREAM.consumer"}
	if got := jm.reply(); got != reply {
		t.Fatalf("reply() = %q, want %q", got, reply)
	}
	if a := testing.AllocsPerRun(100, func() { _ = jm.reply() }); a != 1 {
		t.Errorf("reply: %v allocations, want 1", a)
	}
}

// TestAckState: the consumer sequence and pending count pack into one word
// with the ack flag and come back; numbers that do not fit are refused (the
// message then keeps its whole ack subject), and the message with its ack
// state stays one 320-byte allocation (a Go size class: 16 bytes more would
// cost 32).
func TestAckState(t *testing.T) {
	for _, tc := range []struct {
		cseq, pending uint64
		ok            bool
	}{
		{1, 0, true}, {12345, 99, true}, {1<<40 - 1, 1<<23 - 1, true},
		{1 << 40, 0, false}, {1, 1 << 23, false},
	} {
		st, ok := ackState(tc.cseq, tc.pending)
		if ok != tc.ok {
			t.Errorf("ackState(%d, %d) fits: %v, want %v", tc.cseq, tc.pending, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if st&ackDone != 0 {
			t.Errorf("ackState(%d, %d) has the done flag", tc.cseq, tc.pending)
		}
		for _, w := range []uint64{st, st | ackDone} {
			if c, p := ackNumbersOf(w); c != tc.cseq || p != tc.pending {
				t.Errorf("ackNumbersOf(ackState(%d, %d)) = %d, %d", tc.cseq, tc.pending, c, p)
			}
		}
	}
	if n := unsafe.Sizeof(jsMessage{}); n != 320 {
		t.Errorf("jsMessage is %d bytes, want 320 (one allocation in the 320-byte size class)", n)
	}
}

// TestRouteFor: messages whose ack subjects share a prefix share one route;
// a subject that is not prefix + numbers, or numbers too large for the state
// word, get a route of their own with the whole subject.
func TestRouteFor(t *testing.T) {
	var sh shared
	num := func(cseq, pending uint64) ackNumbers { return ackNumbers{1, 7, cseq, 1764600000000000000, pending} }
	subj := func(cseq, pending uint64) string {
		return "$JS.ACK.S.c" + string(appendTail(nil, num(cseq, pending)))
	}
	route := func(reply string, cseq, pending uint64) (*ackRoute, uint64) {
		p, ok := ackPrefix(reply, num(cseq, pending))
		return sh.routeFor(nil, reply, p, ok, cseq, pending)
	}
	r1, st1 := route(subj(5, 3), 5, 3)
	r2, _ := route(subj(6, 2), 6, 2)
	if r1.whole || r1 != r2 || r1.subject != "$JS.ACK.S.c" {
		t.Errorf("routes %+v and %+v, want one shared prefix route", r1, r2)
	}
	if c, p := ackNumbersOf(st1); c != 5 || p != 3 {
		t.Errorf("state holds %d, %d; want 5, 3", c, p)
	}
	for _, tc := range []struct {
		reply         string
		cseq, pending uint64
	}{
		{subj(5, 3) + ".rnd", 5, 3},  // another form
		{subj(1<<40, 3), 1 << 40, 3}, // the sequence does not fit
		{subj(5, 1<<23), 5, 1 << 23}, // the pending count does not fit
	} {
		r, st := route(tc.reply, tc.cseq, tc.pending)
		if !r.whole || r.subject != tc.reply || r == r1 || st != 0 {
			t.Errorf("%q: route %+v, state %d; want its whole subject", tc.reply, r, st)
		}
	}
}
