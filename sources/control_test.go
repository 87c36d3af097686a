package sources

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/internal/testserver"
	"github.com/shaper-dev/shaper/shaper"
)

// testJetStream starts an in-process NATS server with JetStream
// (internal/testserver) and returns a JetStream context on it, connected as
// the daemon connects; cleanups stop both.
func testJetStream(t *testing.T, opts ...testserver.NATSOption) jetstream.JetStream {
	t.Helper()
	ns := testserver.NATS(t, opts...)
	nc, err := Connect(ns.ClientURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestControlWatch: a record written before Watch is applied before ready
// closes (a restarted daemon reads a pause before its lanes start), and
// later updates reach the watcher; concurrent updates do not lose each
// other's fields.
func TestControlWatch(t *testing.T) {
	js := testJetStream(t)
	ctx := context.Background()
	c, err := OpenControl(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Update(ctx, "payments", func(lc *LaneControl) {
		lc.Pause = &PauseRecord{Reason: "maintenance", At: time.Now()}
	}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]LaneControl{}
	ready, stop, err := c.Watch(ctx, func(lane string, lc LaneControl) {
		mu.Lock()
		seen[lane] = lc
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select {
	case <-ready:
	case <-time.After(5 * time.Second):
		t.Fatal("watch not ready")
	}
	mu.Lock()
	if p := seen["payments"].Pause; p == nil || p.Reason != "maintenance" {
		t.Errorf("before ready: %+v, want the pause written before Watch", seen["payments"])
	}
	mu.Unlock()
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Update(ctx, "payments", func(lc *LaneControl) {
				if i == 0 {
					lc.PurgeUpTo = 42
				} else {
					lc.Pause = nil
					lc.ResumedAt = time.Now()
				}
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		lc := seen["payments"]
		mu.Unlock()
		if lc.PurgeUpTo == 42 && lc.Pause == nil && !lc.ResumedAt.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("watcher saw %+v, want both concurrent updates", lc)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeadLettersReplay: replay republishes to the original subject with
// the original key and Shaper-Replay-Of under a fresh Nats-Msg-Id — the
// original id is still in the source stream's duplicate window, and a
// republish under it would be acknowledged and stored nowhere — and deletes
// each dead letter only after that; list filters by reason.
func TestDeadLettersReplay(t *testing.T) {
	js := testJetStream(t)
	ctx := context.Background()
	if err := EnsureStream(ctx, js, "JOBS", []string{"jobs.>"}); err != nil {
		t.Fatal(err)
	}
	if err := EnsureStream(ctx, js, "DEAD", []string{"shaper.dead.>"}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		key := fmt.Sprintf("order-%d", i)
		orig := &nats.Msg{Subject: fmt.Sprintf("jobs.pay.%d", i), Data: []byte(key), Header: nats.Header{}}
		orig.Header.Set(shaper.MsgIDHeader, key)
		orig.Header.Set("X-Tenant", "acme")
		if _, err := js.PublishMsg(ctx, orig); err != nil {
			t.Fatal(err)
		}
		reason := shaper.ReasonMaxDeliver
		if i == 4 {
			reason = shaper.ReasonInvalid
		}
		dl := &nats.Msg{Subject: "shaper.dead.pay", Data: []byte(key), Header: nats.Header{}}
		dl.Header.Set(shaper.MsgIDHeader, "pay/"+key)
		dl.Header.Set(shaper.KeyHeader, key)
		dl.Header.Set(shaper.OrigMsgIDHeader, key) // as drain's dead letters carry it
		dl.Header.Set(shaper.SubjectHeader, orig.Subject)
		dl.Header.Set("X-Tenant", "acme")
		dl.Header.Set(dlReason, reason)
		dl.Header.Set(dlAttempts, "5")
		if _, err := js.PublishMsg(ctx, dl); err != nil {
			t.Fatal(err)
		}
	}
	d := DeadLetters{JS: js, Subject: "shaper.dead.pay"}
	all, err := d.List(ctx, DeadLetterFilter{})
	if err != nil || len(all) != 5 || all[0].Key != "order-0" || all[0].Attempts != 5 || all[0].Subject != "jobs.pay.0" {
		t.Fatalf("list = %+v, %v", all, err)
	}
	n, err := d.Replay(ctx, DeadLetterFilter{Reason: shaper.ReasonMaxDeliver, Limit: 3})
	if err != nil || n != 3 {
		t.Fatalf("replay = %d, %v; want 3", n, err)
	}
	left, _ := d.List(ctx, DeadLetterFilter{})
	if len(left) != 2 || left[0].Key != "order-3" || left[1].Reason != shaper.ReasonInvalid {
		t.Errorf("left after replay: %+v, want order-3 (max_deliver) and order-4 (invalid)", left)
	}
	if c, _ := d.Count(ctx); c != 2 {
		t.Errorf("Count = %d, want 2", c)
	}
	st, _ := js.Stream(ctx, "JOBS")
	info, _ := st.Info(ctx)
	if info.State.Msgs != 8 {
		t.Fatalf("source stream holds %d, want 5 originals + 3 replays (none swallowed as duplicates)", info.State.Msgs)
	}
	for seq := uint64(6); seq <= 8; seq++ {
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		m := &shaper.Message{Header: map[string][]string(raw.Header)}
		want := fmt.Sprintf("order-%d", seq-6)
		if m.Key() != want || raw.Subject != fmt.Sprintf("jobs.pay.%d", seq-6) || raw.Header.Get("X-Tenant") != "acme" ||
			raw.Header.Get(shaper.ReplayOfHeader) == "" || raw.Header.Get(dlReason) != "" ||
			raw.Header.Get(shaper.OrigMsgIDHeader) != want {
			t.Errorf("replay %d: subject %s key %q headers %v; want key %s, the original headers and Nats-Msg-Id (Shaper-Msg-Id), no dead-letter headers",
				seq, raw.Subject, m.Key(), raw.Header, want)
		}
	}
}
