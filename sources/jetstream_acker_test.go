package sources

import (
	"context"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// TestJetStreamAckerVerbs: the lane's verbs reach a real JetStream server as
// the same verbs: a Nak with a delay is redelivered after that delay (not at
// once: a retry or a Retry-After must not hammer the downstream, case C16),
// a plain Nak at once, InProgress resets the ack wait, and Term ends it.
func TestJetStreamAckerVerbs(t *testing.T) {
	js := testJetStream(t)
	ctx := context.Background()
	src, err := NewJetStream(ctx, js, JetStreamConfig{Stream: "ACK", Subjects: []string{"ack.>"}, Durable: "shaper-ack",
		AckWait: 2 * time.Second, MaxAckPending: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "ack.x", []byte("one")); err != nil {
		t.Fatal(err)
	}
	fetch := func(within time.Duration) (*shaper.Message, time.Duration) {
		t.Helper()
		start := time.Now()
		for time.Since(start) < within {
			var got *shaper.Message
			fctx, cancel := context.WithTimeout(ctx, within-time.Since(start))
			_ = src.Fetch(fctx, 1, func(m *shaper.Message) { got = m })
			cancel()
			if got != nil {
				return got, time.Since(start)
			}
		}
		return nil, time.Since(start)
	}
	m, _ := fetch(5 * time.Second)
	if m == nil {
		t.Fatal("no message")
	}
	// Nak with a delay: back after about 1.5 s, with the delivery count 2.
	if err := m.Acker.Nak(1500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	m, took := fetch(4 * time.Second)
	if m == nil || took < 1400*time.Millisecond {
		t.Fatalf("redelivered after %v, want after the nak delay of 1.5 s (%v)", took, m != nil)
	}
	if m.NumDelivered != 2 {
		t.Errorf("delivery count %d after one nak, want 2", m.NumDelivered)
	}
	// InProgress keeps it: no redelivery within 2 × ack wait while touched.
	for range 4 {
		time.Sleep(time.Second)
		if err := m.Acker.InProgress(); err != nil {
			t.Fatal(err)
		}
	}
	if again, _ := fetch(500 * time.Millisecond); again != nil {
		t.Fatalf("redelivered while in progress (delivery %d)", again.NumDelivered)
	}
	// A plain Nak: back at once.
	if err := m.Acker.Nak(0); err != nil {
		t.Fatal(err)
	}
	m, took = fetch(2 * time.Second)
	if m == nil || took > time.Second {
		t.Fatalf("plain nak redelivered after %v, want at once", took)
	}
	if err := m.Acker.Term("test"); err != nil {
		t.Fatal(err)
	}
	if again, _ := fetch(3 * time.Second); again != nil {
		t.Fatal("redelivered after term")
	}
}
