package sources

import (
	"context"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// TestFetchSkipsRedeliveryOfHeld: a message whose ack wait passed while
// the lane held it (no in-progress ack reached the server: an outage) is
// redelivered by the server; Fetch does not hand that copy to the lane,
// and the held copy's ack settles the message on the server. After a held
// copy's nak, its redelivery is admitted again (nothing lost). A new-user
// pass saw 28 of a bucket of 50 reach the downstream twice after a NATS
// outage longer than ack_wait.
func TestFetchSkipsRedeliveryOfHeld(t *testing.T) {
	js := testJetStream(t)
	ctx := context.Background()
	const ackWait = 300 * time.Millisecond
	src, err := NewJetStream(ctx, js, JetStreamConfig{Stream: "HELD", Subjects: []string{"held.>"}, Durable: "h",
		AckWait: ackWait, MaxAckPending: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, "held.x", []byte("job")); err != nil {
			t.Fatal(err)
		}
	}
	fetch := func(n int) []*shaper.Message {
		t.Helper()
		var got []*shaper.Message
		fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if err := src.Fetch(fctx, n, func(m *shaper.Message) { got = append(got, m) }); err != nil && fctx.Err() == nil {
			t.Fatal(err)
		}
		return got
	}
	held := fetch(3)
	if len(held) != 3 || src.held.len() != 3 {
		t.Fatalf("first fetch: %d messages, %d held; want 3, 3", len(held), src.held.len())
	}
	cons, err := js.Consumer(ctx, "HELD", "h")
	if err != nil {
		t.Fatal(err)
	}
	// No in-progress ack: after the ack wait the server redelivers all
	// three. Fetch until it has (its info counts them), so that a slow
	// server cannot make the check below pass with nothing redelivered.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if again := fetch(3); len(again) != 0 {
			t.Fatalf("after the ack wait, Fetch handed the lane %d redelivered copies of messages it holds, want 0", len(again))
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumRedelivered >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server redelivered %d of 3 within 10 s of an ack wait of %v", info.NumRedelivered, ackWait)
		}
	}
	if err := held[0].Acker.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := held[1].Acker.Nak(0); err != nil {
		t.Fatal(err)
	}
	if n := src.held.len(); n != 1 {
		t.Fatalf("%d held after an ack and a nak, want 1", n)
	}
	// The nak'd message comes back and is admitted; the acked one is gone,
	// and the one still held (its ack wait passes again) is never handed.
	var back []*shaper.Message
	for i := 0; i < 10 && len(back) == 0; i++ {
		back = fetch(1)
	}
	if len(back) != 1 || back[0].StreamSeq != held[1].StreamSeq || back[0].NumDelivered < 2 {
		t.Fatalf("after the nak: %d messages (%v), want the nak'd one (seq %d) redelivered", len(back), seqs(back), held[1].StreamSeq)
	}
	for _, m := range append(back, held[2]) {
		if err := m.Acker.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = js.Conn().Flush()
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.AckFloor.Stream == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pending, ack floor %d: the held copies' acks did not settle the redelivered messages", info.NumAckPending, info.AckFloor.Stream)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := src.held.len(); n != 0 {
		t.Errorf("%d still held after every message was settled", n)
	}
}

func seqs(ms []*shaper.Message) []uint64 {
	var s []uint64
	for _, m := range ms {
		s = append(s, m.StreamSeq)
	}
	return s
}
