// Package sourcetest holds what every source of the worker is tested with:
// [Run], the conformance suite of the contract drain.Source and
// shaper.Acker state and the lane depends on, and [Mem], an in-memory source
// with JetStream's server-side rules for tests on the fake clock. Every
// source passes Run: the JetStream source (sources) and Mem.
//
// It imports neither drain nor sources (drain's own tests use Mem): the
// interface it tests is declared here, and Go interfaces are structural.
package sourcetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Source is drain.Source: Fetch delivers up to max messages to deliver and
// returns when max arrived, ctx ended or its own request expired (a few
// seconds at most).
type Source interface {
	Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error
}

// Fixture is one fresh source under test, on an upstream of its own.
type Fixture struct {
	// Source is the source under test; its server redelivers a message
	// ack wait after its delivery or its last in-progress ack.
	Source Source
	// Publish stores n new messages upstream, each with a payload of its
	// own, for the source to fetch.
	Publish func(t testing.TB, n int)
}

// Factory returns a fresh Fixture whose ack wait is ackWait; cleanups of t
// tear it down.
type Factory func(t *testing.T, ackWait time.Duration) Fixture

// The durations of the suite: an ack wait long enough for a loaded machine
// to send in-progress acks well within it, and a nak delay far enough from
// both 0 and the ack wait to tell them apart.
const (
	ackWait  = 2 * time.Second
	nakDelay = 1200 * time.Millisecond
	// early is how much sooner than asked a redelivery may come: the
	// server's timers and the fetch's round trip.
	early = 150 * time.Millisecond
	// late is how much later than asked a redelivery may come: a pull
	// request in flight (about a second) and a loaded machine.
	late = 3 * time.Second
)

// Run runs the conformance suite against sources made by newSource. It
// takes about 20 s of wall-clock time.
func Run(t *testing.T, newSource Factory) {
	t.Run("FetchDeliversAtMostMax", func(t *testing.T) { testFetchMax(t, newSource) })
	t.Run("AckEndsIt", func(t *testing.T) { testSettled(t, newSource, "ack") })
	t.Run("TermEndsIt", func(t *testing.T) { testSettled(t, newSource, "term") })
	t.Run("NakWithDelayRedeliversAfterTheDelay", func(t *testing.T) { testNakDelay(t, newSource) })
	t.Run("NakZeroRedeliversAtOnce", func(t *testing.T) { testNakZero(t, newSource) })
	t.Run("InProgressResetsAckWait", func(t *testing.T) { testInProgress(t, newSource) })
}

// fetchFor fetches one message at a time for up to d and returns the first
// that arrives (nil if none did) and when.
func fetchFor(t *testing.T, src Source, d time.Duration) (*shaper.Message, time.Time) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		var got *shaper.Message
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := src.Fetch(ctx, 1, func(m *shaper.Message) { got = m })
		cancel()
		if got != nil {
			return got, time.Now()
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond) // a failed pull is retried, as the lane does
		}
	}
	return nil, time.Now()
}

// checkMessage checks what every delivery carries.
func checkMessage(t *testing.T, m *shaper.Message) {
	t.Helper()
	if m.Acker == nil {
		t.Fatal("delivery without an Acker")
	}
	if m.Invalid != "" {
		t.Errorf("delivery invalid: %s", m.Invalid)
	}
	if m.Stream == "" || m.StreamSeq == 0 {
		t.Errorf("Stream %q, StreamSeq %d: both must be set", m.Stream, m.StreamSeq)
	}
	if m.Published.IsZero() {
		t.Error("Published not set")
	}
	if m.NumDelivered == 0 {
		t.Error("NumDelivered 0: the first delivery is 1")
	}
	if m.Key() == "" {
		t.Error("empty key")
	}
}

// checkRedelivery checks that again is m delivered once more: the same
// message and key (G8), the count one higher.
func checkRedelivery(t *testing.T, m, again *shaper.Message) {
	t.Helper()
	checkMessage(t, again)
	if again.Key() != m.Key() || again.StreamSeq != m.StreamSeq || string(again.Data) != string(m.Data) {
		t.Errorf("redelivered key %q seq %d data %q, want the same message: key %q seq %d data %q",
			again.Key(), again.StreamSeq, again.Data, m.Key(), m.StreamSeq, m.Data)
	}
	if again.NumDelivered != m.NumDelivered+1 {
		t.Errorf("NumDelivered %d on the redelivery, want %d", again.NumDelivered, m.NumDelivered+1)
	}
}

// first publishes one message and fetches it.
func first(t *testing.T, newSource Factory) (Source, *shaper.Message, time.Time) {
	t.Helper()
	f := newSource(t, ackWait)
	f.Publish(t, 1)
	m, at := fetchFor(t, f.Source, 5*time.Second)
	if m == nil {
		t.Fatal("the published message was not delivered within 5 s")
	}
	checkMessage(t, m)
	if m.NumDelivered != 1 {
		t.Errorf("NumDelivered %d on the first delivery, want 1", m.NumDelivered)
	}
	return f.Source, m, at
}

// testFetchMax: a Fetch delivers at most max; every message once, with
// keys of its own.
func testFetchMax(t *testing.T, newSource Factory) {
	const n, max = 7, 3
	f := newSource(t, ackWait)
	f.Publish(t, n)
	keys := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for len(keys) < n && time.Now().Before(deadline) {
		var batch []*shaper.Message
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = f.Source.Fetch(ctx, max, func(m *shaper.Message) { batch = append(batch, m) })
		cancel()
		if len(batch) > max {
			t.Fatalf("Fetch(max %d) delivered %d", max, len(batch))
		}
		for _, m := range batch {
			checkMessage(t, m)
			if keys[m.Key()] {
				t.Errorf("key %q delivered twice without a nak or an expired ack wait", m.Key())
			}
			keys[m.Key()] = true
			if err := m.Acker.Ack(context.Background()); err != nil {
				t.Errorf("Ack: %v", err)
			}
		}
	}
	if len(keys) != n {
		t.Errorf("%d of %d messages delivered within 10 s", len(keys), n)
	}
}

// testSettled: after an Ack or a Term the message never comes back, not
// even after its ack wait.
func testSettled(t *testing.T, newSource Factory, verb string) {
	src, m, _ := first(t, newSource)
	var err error
	if verb == "ack" {
		err = m.Acker.Ack(context.Background())
	} else {
		err = m.Acker.Term("sourcetest")
	}
	if err != nil {
		t.Fatalf("%s: %v", verb, err)
	}
	if again, _ := fetchFor(t, src, ackWait+time.Second); again != nil {
		t.Errorf("redelivered (delivery %d) after %s", again.NumDelivered, verb)
	}
}

// testNakDelay: Nak(delay) brings the message back after about delay, not
// at once, with the delivery count one higher (a retry or a Retry-After
// must not hammer the downstream, case C16).
func testNakDelay(t *testing.T, newSource Factory) {
	src, m, _ := first(t, newSource)
	nakAt := time.Now()
	if err := m.Acker.Nak(nakDelay); err != nil {
		t.Fatal(err)
	}
	again, at := fetchFor(t, src, nakDelay+late)
	if again == nil {
		t.Fatalf("not redelivered within %s of Nak(%s)", nakDelay+late, nakDelay)
	}
	if took := at.Sub(nakAt); took < nakDelay-early {
		t.Errorf("redelivered %s after Nak(%s): too soon", took, nakDelay)
	}
	checkRedelivery(t, m, again)
	_ = again.Acker.Ack(context.Background())
}

// testNakZero: Nak(0) brings the message back at once.
func testNakZero(t *testing.T, newSource Factory) {
	src, m, _ := first(t, newSource)
	nakAt := time.Now()
	if err := m.Acker.Nak(0); err != nil {
		t.Fatal(err)
	}
	again, at := fetchFor(t, src, late)
	if again == nil {
		t.Fatalf("not redelivered within %s of Nak(0)", late)
	}
	if took := at.Sub(nakAt); took > nakDelay-early {
		t.Errorf("redelivered %s after Nak(0), want at once", took)
	}
	checkRedelivery(t, m, again)
	_ = again.Acker.Ack(context.Background())
}

// testInProgress: in-progress acks keep a message past its ack wait (G7);
// without them it comes back at ack wait, with the count one higher.
func testInProgress(t *testing.T, newSource Factory) {
	src, m, _ := first(t, newSource)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(ackWait / 4)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if err := m.Acker.InProgress(); err != nil {
					t.Errorf("InProgress: %v", err)
					return
				}
			}
		}
	})
	held := 2*ackWait + ackWait/2
	again, _ := fetchFor(t, src, held)
	close(stop)
	wg.Wait()
	lastTouch := time.Now()
	if again != nil {
		t.Fatalf("redelivered (delivery %d) while in-progress acks were sent every %s for %s (ack wait %s)",
			again.NumDelivered, ackWait/4, held, ackWait)
	}
	// The last in-progress ack was at most a quarter of ack wait ago: the
	// redelivery comes at ack wait after it, not sooner than 3/4 of it.
	again, at := fetchFor(t, src, ackWait+late)
	if again == nil {
		t.Fatalf("not redelivered within %s after the in-progress acks stopped (ack wait %s)", ackWait+late, ackWait)
	}
	if took := at.Sub(lastTouch); took < ackWait*3/4-early {
		t.Errorf("redelivered %s after the in-progress acks stopped, want about ack wait (%s)", took, ackWait)
	}
	checkRedelivery(t, m, again)
	_ = again.Acker.Ack(context.Background())
}
