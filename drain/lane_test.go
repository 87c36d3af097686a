package drain

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/shaper/shapertest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// laneConfig returns a valid lane configuration; tests adjust it.
func laneConfig(limit float64) config.Lane {
	return config.Lane{
		Source: config.Source{Stream: "MEM", Subjects: []string{"jobs"}, Consumer: "shaper-test", AckWait: time.Minute, MaxDeliver: 5},
		Bucket: config.Bucket{Capacity: 1000, Overflow: "block"},
		Rate:   config.Rate{Limit: shaper.Limit(limit), Warmup: config.Warmup{ColdFactor: 3}},
		Task: config.Task{Timeout: 5 * time.Second, MaxInFlight: 8,
			Retry: config.Retry{Backoff: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}, RetryAfter: true, MaxDelay: 5 * time.Minute}},
		DeadLetter: config.DeadLetter{Subject: "shaper.dead.test"},
		Sink:       config.Sink{Kind: "log"},
	}
}

// recSink records every call; behave decides the outcome of each.
type recSink struct {
	mu     sync.Mutex
	calls  []call
	behave func(c call) (time.Duration, error) // latency, result
}

type call struct {
	at      time.Time
	id      string
	attempt uint64
	header  map[string][]string
}

func (s *recSink) Send(ctx context.Context, m *shaper.Message) error {
	c := call{at: time.Now(), id: string(m.Data), attempt: m.NumDelivered, header: m.Header}
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	var d time.Duration
	var err error
	if s.behave != nil {
		d, err = s.behave(c)
	}
	if d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return &shaper.SinkError{Err: ctx.Err()}
		}
	}
	return err
}

func (s *recSink) snapshot() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]call(nil), s.calls...)
}

func times(cs []call) []time.Time {
	out := make([]time.Time, len(cs))
	for i, c := range cs {
		out[i] = c.at
	}
	return out
}

func maxInWindow(ts []time.Time, w time.Duration) int {
	n, _ := shapertest.MaxInWindow(ts, w)
	return n
}

type harness struct {
	t    *testing.T
	src  *sourcetest.Mem
	sink *recSink
	dead *recSink
	reg  *prometheus.Registry
	m    *metrics.Lane
	lane *Lane
}

func newHarness(t *testing.T, cfg config.Lane, sink *recSink) *harness {
	t.Helper()
	h := &harness{t: t, src: sourcetest.NewMem(cfg.Source.AckWait), sink: sink, dead: &recSink{}, reg: prometheus.NewRegistry()}
	h.m = metrics.New(h.reg).Lane("test", float64(cfg.Rate.Limit))
	l, err := New("test", cfg, h.src, sink, WithWaiter(TimerWaiter{}), WithMetrics(h.m), WithDeadLetter(h.dead))
	if err != nil {
		t.Fatal(err)
	}
	h.lane = l
	return h
}

// stop drains the lane with the given budget and stops the fake server.
func (h *harness) stop(budget time.Duration) Summary {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	s := h.lane.Drain(ctx)
	h.src.Close()
	twice := h.src.SettledTwice()
	if twice > 0 {
		h.t.Errorf("%d deliveries got a second final verb (ack/nak/term): SPEC G4 settles each once", twice)
	}
	return s
}

// TestLaneBacklogAtRate is issue 2's end-to-end shape on the fake clock: a
// burst of 300 at 100/s leaves exactly 10 ms apart, in order, all acked.
func TestLaneBacklogAtRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(call) (time.Duration, error) { return 5 * time.Millisecond, nil }}
		h := newHarness(t, laneConfig(100), sink)
		h.src.Publish(300)
		start := time.Now()
		h.lane.Start()
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 300 {
			t.Fatalf("%d calls, want 300", len(cs))
		}
		for i, c := range cs {
			if c.id != fmt.Sprintf("msg-%d", i) {
				t.Fatalf("call %d is %s: order broken", i, c.id)
			}
			if i > 0 {
				if g := c.at.Sub(cs[i-1].at); g != 10*time.Millisecond {
					t.Fatalf("gap %d = %v, want 10ms", i, g)
				}
			}
		}
		if cs[0].at != start {
			t.Errorf("first departure %v after start, want at once", cs[0].at.Sub(start))
		}
		if n := h.src.Count("acked"); n != 300 {
			t.Errorf("%d acked, want 300", n)
		}
		if got := testutil.ToFloat64(h.m.Departures); got != 300 {
			t.Errorf("departures metric %v", got)
		}
		if got := testutil.ToFloat64(h.m.Deliveries[shaper.OutcomeSuccess]); got != 300 {
			t.Errorf("deliveries{success} metric %v", got)
		}
	})
}

// TestLaneSlowSinkKeepsCadence: G5 — a sink taking 100 ms per call does not
// delay departures while slots are free.
func TestLaneSlowSinkKeepsCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			if c.id == "msg-5" {
				return 3 * time.Second, nil // one very slow call
			}
			return 100 * time.Millisecond, nil
		}}
		h := newHarness(t, laneConfig(50), sink)
		h.src.Publish(100)
		h.lane.Start()
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		h.stop(5 * time.Second)
		cs := sink.snapshot()
		if len(cs) != 100 {
			t.Fatalf("%d calls, want 100", len(cs))
		}
		for i := 1; i < len(cs); i++ {
			if g := cs[i].at.Sub(cs[i-1].at); g != 20*time.Millisecond {
				t.Fatalf("gap %d = %v, want 20ms: a slow call delayed a departure", i, g)
			}
		}
	})
}

// TestLaneFullSlotsEarnNoCatchUp: G2/G5 — while max_in_flight tasks are all
// busy departures wait; once slots free up, the rate resumes with no burst.
func TestLaneFullSlotsEarnNoCatchUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var slow sync.Map
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			var n int
			fmt.Sscanf(c.id, "msg-%d", &n)
			if n < 4 {
				slow.Store(c.id, true)
				return time.Second, nil
			}
			return time.Millisecond, nil
		}}
		cfg := laneConfig(100)
		cfg.Task.MaxInFlight = 2
		h := newHarness(t, cfg, sink)
		h.src.Publish(200)
		h.lane.Start()
		time.Sleep(4 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 200 {
			t.Fatalf("%d calls, want 200", len(cs))
		}
		// msg-0,1 at once and +10ms; msg-2,3 wait for slots (1 s later).
		for i := 4; i < len(cs); i++ {
			if g := cs[i].at.Sub(cs[i-1].at); g < 10*time.Millisecond {
				t.Fatalf("gap %d after the stall = %v < 10ms: catch-up burst", i, g)
			}
		}
		if w := maxInWindow(times(cs), time.Second); w > 101 {
			t.Errorf("%d in a 1s window, bound 101", w)
		}
	})
}

// TestLaneTimeoutRetriesLater: a hanging call ends at task.timeout, the
// message is nak'd with the first backoff and delivered later; the cadence
// of the others holds.
func TestLaneTimeoutRetriesLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			if c.id == "msg-3" && c.attempt == 1 {
				return time.Hour, nil
			}
			return 5 * time.Millisecond, nil
		}}
		cfg := laneConfig(20)
		cfg.Task.Timeout = 300 * time.Millisecond
		cfg.Task.MaxInFlight = 4
		cfg.Task.Retry.Backoff = []time.Duration{500 * time.Millisecond}
		h := newHarness(t, cfg, sink)
		h.src.Publish(40)
		h.lane.Start()
		time.Sleep(4 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 41 {
			t.Fatalf("%d calls, want 41 (40 + one retry)", len(cs))
		}
		var attempts3 []call
		for i, c := range cs {
			if c.id == "msg-3" {
				attempts3 = append(attempts3, c)
			}
			if i > 0 && c.at.Sub(cs[i-1].at) != 50*time.Millisecond {
				t.Errorf("gap %d = %v, want 50ms", i, c.at.Sub(cs[i-1].at))
			}
		}
		if len(attempts3) != 2 || attempts3[1].attempt != 2 {
			t.Fatalf("msg-3 attempts %+v, want 2", attempts3)
		}
		if d := attempts3[1].at.Sub(attempts3[0].at); d < 800*time.Millisecond {
			t.Errorf("retry %v after the first attempt, want ≥ timeout + backoff", d)
		}
		if n := h.src.Count("acked"); n != 40 {
			t.Errorf("%d acked, want 40", n)
		}
		if c := histCount(t, h.reg, "shaper_task_duration_seconds", "timeout"); c != 1 {
			t.Errorf("timeout task count %d, want 1", c)
		}
	})
}

// histCount is how many observations the histogram name holds in reg, as a
// scrape reads it: in its series with that outcome label, or in all of
// them when outcome is "".
func histCount(t *testing.T, reg *prometheus.Registry, name, outcome string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if outcome == "" {
				n += m.GetHistogram().GetSampleCount()
				continue
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" && lp.GetValue() == outcome {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// TestCase_C17_RetryAfterPausesTheLane: bullmq#1571 — a downstream's 429 with
// Retry-After pauses the whole lane instead of burning every message's
// retry budget; the lane resumes at the rate with no burst.
func TestCase_C17_RetryAfterPausesTheLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			if time.Since(start) < 10*time.Second {
				return 0, &shaper.SinkError{Status: 429, RetryAfter: 2 * time.Second, Saturated: true}
			}
			return 0, nil
		}}
		cfg := laneConfig(10)
		cfg.Source.MaxDeliver = 3
		h := newHarness(t, cfg, sink)
		h.src.Publish(100)
		h.lane.Start()
		time.Sleep(25 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		var early []time.Time
		for _, c := range cs {
			if c.at.Sub(start) < 10*time.Second {
				early = append(early, c.at)
			}
		}
		// ≤ 1 probe every 2 s during [0,10).
		if w := maxInWindow(early, 2*time.Second); w > 1 {
			t.Errorf("%d calls in a 2s window during the 429 period, want ≤ 1", w)
		}
		if n := h.src.Count("acked"); n != 100 {
			t.Errorf("%d acked by t=25s, want 100", n)
		}
		if n := len(h.dead.snapshot()); n != 0 {
			t.Errorf("%d dead letters, want 0", n)
		}
		last := cs[len(cs)-1].at.Sub(start)
		if last > 21*time.Second {
			t.Errorf("last delivery at %v, want ≤ 21s", last)
		}
		if w := maxInWindow(times(cs), time.Second); w > 11 {
			t.Errorf("%d calls in a 1s window, bound 11", w)
		}
		if got := testutil.ToFloat64(h.m.Retries[shaper.RetryRateLimited]); got < 1 {
			t.Errorf("retries{rate_limited} = %v, want counted separately", got)
		}
	})
}

// TestLanePermanentFailureDeadLetters: a 400 is not retried; the message is
// published to the dead letter with its Shaper-* headers, then terminated.
func TestLanePermanentFailureDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			if c.id == "msg-1" {
				return 0, &shaper.SinkError{Status: 400, Permanent: true, Err: errors.New("bad request")}
			}
			return 0, nil
		}}
		h := newHarness(t, laneConfig(100), sink)
		h.src.Publish(3)
		h.lane.Start()
		time.Sleep(time.Second)
		synctest.Wait()
		h.stop(time.Second)
		dl := h.dead.snapshot()
		if len(dl) != 1 || dl[0].id != "msg-1" {
			t.Fatalf("dead letters %+v, want msg-1", dl)
		}
		for k, want := range map[string]string{HeaderReason: "rejected_by_sink", HeaderDownstream: "test", HeaderAttempts: "1",
			HeaderLastStatus: "400", HeaderStream: "MEM", HeaderStreamSeq: "2",
			// Two lanes may dead-letter the same key: the dead letter's own
			// id names the lane, or the stream would drop one as a duplicate.
			HeaderKey: "MEM:2", shaper.MsgIDHeader: "test/MEM:2@"} {
			if got := dl[0].header[k]; len(got) != 1 || got[0] != want && !(k == shaper.MsgIDHeader && strings.HasPrefix(got[0], want)) {
				t.Errorf("header %s = %v, want %q", k, got, want)
			}
		}
		if got := dl[0].header[HeaderLastError]; len(got) != 1 || got[0] == "" {
			t.Errorf("header %s missing", HeaderLastError)
		}
		if got, ok := dl[0].header[shaper.OrigMsgIDHeader]; ok {
			t.Errorf("header %s = %v on a job published without a Nats-Msg-Id, want none", shaper.OrigMsgIDHeader, got)
		}
		if n := h.src.Count("termed"); n != 1 {
			t.Errorf("%d termed, want 1", n)
		}
		if n := h.src.Count("acked"); n != 2 {
			t.Errorf("%d acked, want 2", n)
		}
		if len(sink.snapshot()) != 3 {
			t.Errorf("a permanent failure was retried")
		}
		if got := testutil.ToFloat64(h.m.DeadLetters[shaper.ReasonRejectedBySink]); got != 1 {
			t.Errorf("dead_letters{rejected_by_sink} = %v", got)
		}
	})
}

// TestLaneDeadLetterKeepsPublisherID: a dead letter travels under an id of
// its own, and keeps the job's Nats-Msg-Id as Shaper-Msg-Id, which a replay
// carries and the HTTP sink sends as X-Nats-Msg-Id; a replay's dead letter
// keeps the publisher's, not the replay's.
func TestLaneDeadLetterKeepsPublisherID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			return 0, &shaper.SinkError{Status: 400, Permanent: true}
		}}
		h := newHarness(t, laneConfig(100), sink)
		h.src.PublishHeaders(map[string][]string{shaper.MsgIDHeader: {"order-7"}, shaper.OrigMsgIDHeader: {"forged"}},
			map[string][]string{shaper.MsgIDHeader: {"replay/DEAD/3"}, shaper.KeyHeader: {"order-8"},
				shaper.ReplayOfHeader: {"3"}, shaper.OrigMsgIDHeader: {"order-8"}},
			// A replay of a job published without a Nats-Msg-Id: its dead
			// letter gets none, not the replay's id.
			map[string][]string{shaper.MsgIDHeader: {"replay/DEAD/4"}, shaper.KeyHeader: {"MEM:9"},
				shaper.ReplayOfHeader: {"4"}})
		h.lane.Start()
		time.Sleep(time.Second)
		synctest.Wait()
		h.stop(time.Second)
		dl := h.dead.snapshot()
		if len(dl) != 3 {
			t.Fatalf("%d dead letters, want 3", len(dl))
		}
		for i, want := range []string{"order-7", "order-8"} {
			if got := dl[i].header[shaper.OrigMsgIDHeader]; len(got) != 1 || got[0] != want {
				t.Errorf("dead letter %d: %s = %v, want [%s]", i, shaper.OrigMsgIDHeader, got, want)
			}
		}
		if got, ok := dl[2].header[shaper.OrigMsgIDHeader]; ok {
			t.Errorf("dead letter of a replay of a job without a Nats-Msg-Id: %s = %v, want none", shaper.OrigMsgIDHeader, got)
		}
	})
}

// TestLaneMaxDeliverDeadLetters: retryable failures are nak'd with the
// backoff of their delivery count until source.max_deliver, then dead-lettered.
func TestLaneMaxDeliverDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			return 0, &shaper.SinkError{Status: 500}
		}}
		cfg := laneConfig(100)
		cfg.Source.MaxDeliver = 3
		cfg.Task.Retry.Backoff = []time.Duration{time.Second, 2 * time.Second}
		h := newHarness(t, cfg, sink)
		h.src.Publish(1)
		h.lane.Start()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 3 {
			t.Fatalf("%d attempts, want 3", len(cs))
		}
		if g1, g2 := cs[1].at.Sub(cs[0].at), cs[2].at.Sub(cs[1].at); g1 != time.Second || g2 != 2*time.Second {
			t.Errorf("retry gaps %v, %v; want 1s, 2s (backoff by delivery count)", g1, g2)
		}
		dl := h.dead.snapshot()
		if len(dl) != 1 || dl[0].header[HeaderReason][0] != "max_deliver" || dl[0].header[HeaderAttempts][0] != "3" {
			t.Fatalf("dead letters %+v", dl)
		}
	})
}

// TestLaneDeadLetterPublishFailureLosesNothing: when the dead-letter publish
// fails, the original is nak'd, not terminated (G4).
func TestLaneDeadLetterPublishFailureLosesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			return 0, &shaper.SinkError{Status: 404, Permanent: true}
		}}
		h := newHarness(t, laneConfig(100), sink)
		h.dead.behave = func(call) (time.Duration, error) { return 0, errors.New("stream full") }
		h.src.Publish(1)
		h.lane.Start()
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		h.stop(time.Second)
		if n := h.src.Count("termed"); n != 0 {
			t.Errorf("%d terminated although the dead letter was not stored", n)
		}
		if v := h.src.Messages()[0].Verbs; len(v) == 0 || v[0] != "nak@1" {
			t.Errorf("verbs %v, want a nak", v)
		}
	})
}

// TestCase_C14_HeldMessagesGetInProgress: nats.net#608 — messages waiting in
// the bucket longer than ack wait are never redelivered by the server: the
// lane sends in-progress acks (G7). 600 messages at 10/s take 60 s, twice
// the ack wait of 30 s.
func TestCase_C14_HeldMessagesGetInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(call) (time.Duration, error) { return 20 * time.Millisecond, nil }}
		cfg := laneConfig(10)
		cfg.Source.AckWait = 30 * time.Second
		cfg.Bucket.Capacity = 500
		h := newHarness(t, cfg, sink)
		h.src.Publish(600)
		h.lane.Start()
		time.Sleep(61 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if h.src.Redelivered() != 0 {
			t.Errorf("%d redeliveries by ack wait, want 0", h.src.Redelivered())
		}
		seen := map[string]int{}
		for _, c := range sink.snapshot() {
			seen[c.id]++
		}
		if len(seen) != 600 {
			t.Errorf("%d distinct delivered, want 600", len(seen))
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("%s delivered %d times", id, n)
			}
		}
		if n := h.src.Count("acked"); n != 600 {
			t.Errorf("%d acked, want 600", n)
		}
	})
}

// TestCase_C18_DrainHandsBackTheBucket: nats.go#1328 — on stop the buffered
// messages are delivered at the rate until the drain timeout, and the rest
// are handed back with a nak (no term, no dead letter); no fetch starts
// after the drain began.
func TestCase_C18_DrainHandsBackTheBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(10)
		cfg.Source.AckWait = 60 * time.Second
		cfg.Bucket.Capacity = 200
		h := newHarness(t, cfg, sink)
		h.src.Publish(1000)
		h.lane.Start()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		fetchesAtStop := h.src.Fetches()
		drainStart := time.Now()
		sum := h.stop(10 * time.Second)
		if d := time.Since(drainStart); d > 11*time.Second {
			t.Errorf("drain took %v, want ≤ drain timeout + 1s", d)
		}
		if h.src.Fetches() > fetchesAtStop {
			t.Errorf("%d fetches after the drain began", h.src.Fetches()-fetchesAtStop)
		}
		var during []time.Time
		for _, c := range sink.snapshot() {
			if c.at.After(drainStart) {
				during = append(during, c.at)
			}
		}
		if w := maxInWindow(during, time.Second); w > 11 {
			t.Errorf("%d deliveries in a 1s window during the drain, want ≤ 11", w)
		}
		if len(during) < 95 || len(during) > 101 {
			t.Errorf("%d delivered during a 10s drain at 10/s", len(during))
		}
		if sum.Leftovers < 90 {
			t.Errorf("leftovers %d, want the rest of the bucket (~100)", sum.Leftovers)
		}
		if n := h.src.Count("termed"); n != 0 {
			t.Errorf("%d terminated", n)
		}
		pending := 0
		for _, m := range h.src.Messages() {
			if m.State == sourcetest.Pending {
				pending++
			}
		}
		if pending != 0 {
			t.Errorf("%d messages still held by nobody after the drain", pending)
		}
		if got := int(sum.Delivered); got != len(during) {
			t.Errorf("summary delivered %d, downstream saw %d", got, len(during))
		}
	})
}

// TestCase_C10_RejectOverflowByMaxWait: nginx limit_req burst without
// nodelay — with overflow reject and max_wait 1.5 s at 10/s, of 30 messages
// at once 16 are delivered (t = 0.0 … 1.5) and 14 dead-lettered at once.
func TestCase_C10_RejectOverflowByMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(call) (time.Duration, error) { return 10 * time.Millisecond, nil }}
		cfg := laneConfig(10)
		cfg.Bucket.Capacity = 20
		cfg.Bucket.Overflow = "reject"
		cfg.Bucket.MaxWait = 1500 * time.Millisecond
		h := newHarness(t, cfg, sink)
		h.src.Publish(30)
		start := time.Now()
		h.lane.Start()
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if n := len(h.dead.snapshot()); n != 14 {
			t.Errorf("%d dead-lettered within 100ms, want 14", n)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 16 {
			t.Fatalf("%d delivered, want 16", len(cs))
		}
		for i, c := range cs {
			if want := time.Duration(i) * 100 * time.Millisecond; c.at.Sub(start) != want {
				t.Errorf("delivery %d at %v, want %v", i, c.at.Sub(start), want)
			}
		}
		delivered := map[string]bool{}
		for _, c := range cs {
			delivered[c.id] = true
		}
		for _, d := range h.dead.snapshot() {
			if delivered[d.id] {
				t.Errorf("%s both delivered and dead-lettered", d.id)
			}
			if r := d.header[HeaderReason][0]; r != "max_wait" && r != "overflow" {
				t.Errorf("reason %q", r)
			}
		}
		total := testutil.ToFloat64(h.m.DeadLetters[shaper.ReasonMaxWait]) + testutil.ToFloat64(h.m.DeadLetters[shaper.ReasonOverflow])
		if total != 14 {
			t.Errorf("dead_letters metric %v, want 14", total)
		}
	})
}

// TestLaneWarmupColdStart: issue 3's numbers end to end on the fake clock —
// limit 100/s, cold factor 4, period 4 s: at most 35 in the first second,
// and departures never exceed the ramp's integral plus one.
func TestLaneWarmupColdStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(100)
		cfg.Rate.Warmup = config.Warmup{Period: 4 * time.Second, ColdFactor: 4}
		h := newHarness(t, cfg, sink)
		h.src.Publish(600)
		start := time.Now()
		h.lane.Start()
		time.Sleep(6 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		first := 0
		for i, c := range cs {
			x := c.at.Sub(start).Seconds()
			if x < 1 {
				first++
			}
			integral := 100 * (0.25*math.Min(x, 4) + 0.75*math.Min(x, 4)*math.Min(x, 4)/8 + math.Max(0, x-4))
			if float64(i+1) > integral+1+1e-6 {
				t.Fatalf("departure %d at %.3fs exceeds the ramp integral %.2f + 1", i+1, x, integral)
			}
		}
		if first > 35 {
			t.Errorf("%d in the first second, want ≤ 35", first)
		}
	})
}

// TestLaneInvalidMessagesDeadLetter: a payload over source.max_message_bytes
// is dead-lettered with reason "invalid", never sent downstream, and does
// not hold a bucket slot.
func TestLaneInvalidMessagesDeadLetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(100)
		cfg.Source.MaxMessageBytes = 5 // "msg-0".."msg-9" fit, "msg-10" does not
		cfg.Bucket.Capacity = 4
		h := newHarness(t, cfg, sink)
		h.src.Publish(12)
		h.lane.Start()
		time.Sleep(time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if n := len(sink.snapshot()); n != 10 {
			t.Errorf("%d delivered, want 10", n)
		}
		dl := h.dead.snapshot()
		if len(dl) != 2 || dl[0].header[HeaderReason][0] != "invalid" {
			t.Fatalf("dead letters %+v, want 2 invalid", dl)
		}
		if n := h.src.Count("termed"); n != 2 {
			t.Errorf("%d termed, want 2", n)
		}
	})
}

// TestCase_C07_WarmupUnderLowDemand: guava#3552 — at 10/s with a 0.5 s
// warmup, demand of one message every 120 ms (8.3/s, below the limit) must
// not be stuck at the cold rate. SPEC §3 defines warmth precisely (it rises
// only while the bucket holds messages and cools while it is empty), so the
// lane settles where the time spent waiting balances the time spent empty:
// below the full rate but well above the cold rate, serving all the demand.
// The case's "dispatched within 20 ms" does not hold under SPEC §3's rule
// (SPEC wins): messages wait up to one interval at the equilibrium rate; we
// assert the SPEC-consistent bound instead (≤ 120 ms, the arrival period).
func TestCase_C07_WarmupUnderLowDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(10)
		cfg.Rate.Warmup = config.Warmup{Period: 500 * time.Millisecond, ColdFactor: 3}
		cfg.Bucket.Capacity = 1
		cfg.Bucket.Overflow = "reject"
		h := newHarness(t, cfg, sink)
		start := time.Now()
		h.lane.Start()
		published := map[string]time.Time{}
		for i := range 100 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * 120 * time.Millisecond)))
			published[fmt.Sprintf("msg-%d", i)] = time.Now()
			h.src.Publish(1)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		h.stop(time.Second)
		late, in212 := 0, 0
		var worst time.Duration
		for _, c := range sink.snapshot() {
			x := c.at.Sub(start)
			if x >= 2*time.Second && x < 12*time.Second {
				in212++
			}
			if published[c.id].Sub(start) >= 2*time.Second {
				worst = max(worst, c.at.Sub(published[c.id]))
				if c.at.Sub(published[c.id]) > 120*time.Millisecond {
					late++
				}
			}
		}
		var overflowAfter2 int
		for _, d := range h.dead.snapshot() {
			if published[d.id].Sub(start) >= 2*time.Second {
				overflowAfter2++
			}
		}
		if overflowAfter2 != 0 {
			t.Errorf("%d overflow rejections after t=2s, want 0", overflowAfter2)
		}
		if in212 < 80 {
			t.Errorf("%d deliveries in [2,12), want ≥ 80", in212)
		}
		if late != 0 {
			t.Errorf("%d messages waited more than 120ms after t=2 (worst %v)", late, worst)
		}
		t.Logf("worst dispatch delay after t=2: %v", worst)
	})
}

// TestCase_C16_RetryAfterOnOneMessage: nats-server#4726 — a 503 with
// Retry-After: 5 on one message must be retried no sooner than 5 s later
// (not hammered by an immediate nak) and acked once it succeeds; a huge
// Retry-After is capped by retry.max_delay. SPEC §3 decides that a 429/503
// with Retry-After pauses the whole lane (the downstream said it is
// saturated), so unlike the case the other messages do not keep ≥ 9/s while
// the pause lasts; they resume at the rate after each pause (SPEC wins).
func TestCase_C16_RetryAfterOnOneMessage(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter time.Duration
		maxDelay   time.Duration
		wantGap    time.Duration
	}{
		{"delta-seconds", 5 * time.Second, 5 * time.Minute, 5 * time.Second},
		{"capped", time.Hour, time.Minute, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				sink := &recSink{behave: func(c call) (time.Duration, error) {
					if c.id == "msg-7" && time.Since(start) < 20*time.Second {
						return 0, &shaper.SinkError{Status: 503, RetryAfter: tc.retryAfter, Saturated: true}
					}
					return 0, nil
				}}
				cfg := laneConfig(10)
				cfg.Source.MaxDeliver = 10
				cfg.Task.Retry.MaxDelay = tc.maxDelay
				h := newHarness(t, cfg, sink)
				h.src.Publish(50)
				h.lane.Start()
				time.Sleep(3 * time.Minute)
				synctest.Wait()
				h.stop(time.Second)
				var att []time.Time
				for _, c := range sink.snapshot() {
					if c.id == "msg-7" {
						att = append(att, c.at)
					}
				}
				if len(att) > 5 {
					t.Errorf("msg-7 attempted %d times, want ≤ 5", len(att))
				}
				for i := 1; i < len(att); i++ {
					if g := att[i].Sub(att[i-1]); g < tc.wantGap {
						t.Errorf("msg-7 attempt gap %v < %v", g, tc.wantGap)
					}
				}
				if n := h.src.Count("acked"); n != 50 {
					t.Errorf("%d acked, want 50", n)
				}
				if w := maxInWindow(times(sink.snapshot()), time.Second); w > 11 {
					t.Errorf("%d in a 1s window after a pause, bound 11", w)
				}
			})
		})
	}
}

// TestLaneRetryAfterEdges: a Retry-After in the past (0) falls back to the
// backoff; one longer than ack wait is used as it is (the server holds a
// nak'd message without ack wait); retry_after false ignores the header.
func TestLaneRetryAfterEdges(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter time.Duration
		honour     bool
		wantGap    time.Duration
	}{
		{"past date", 0, true, time.Second},
		{"longer than ack wait", 90 * time.Second, true, 90 * time.Second},
		{"ignored", 20 * time.Second, false, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sink := &recSink{behave: func(c call) (time.Duration, error) {
					if c.attempt == 1 {
						return 0, &shaper.SinkError{Status: 429, RetryAfter: tc.retryAfter, Saturated: true}
					}
					return 0, nil
				}}
				cfg := laneConfig(100)
				cfg.Source.AckWait = 30 * time.Second
				cfg.Task.Retry.RetryAfter = tc.honour
				h := newHarness(t, cfg, sink)
				h.src.Publish(1)
				h.lane.Start()
				time.Sleep(2 * time.Minute)
				synctest.Wait()
				h.stop(time.Second)
				cs := sink.snapshot()
				if len(cs) != 2 {
					t.Fatalf("%d attempts, want 2", len(cs))
				}
				if g := cs[1].at.Sub(cs[0].at); g != tc.wantGap {
					t.Errorf("retry after %v, want %v", g, tc.wantGap)
				}
			})
		})
	}
}

// TestLaneUpdateInPlace: hot reload changes the rate, capacity and
// max_in_flight of a running lane; held messages stay, none is nak'd or
// redelivered, and the new rate applies from the next departure.
func TestLaneUpdateInPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(100)
		h := newHarness(t, cfg, sink)
		h.src.Publish(300)
		start := time.Now()
		h.lane.Start()
		time.Sleep(time.Second - time.Millisecond)
		synctest.Wait()
		next := cfg
		next.Rate.Limit = 50
		next.Bucket.Capacity = 500
		next.Task.MaxInFlight = 2
		if err := h.lane.Update(next); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		for i := 1; i < len(cs); i++ {
			g := cs[i].at.Sub(cs[i-1].at)
			x := cs[i].at.Sub(start)
			switch {
			case x < time.Second && g != 10*time.Millisecond:
				t.Fatalf("gap %d before the update = %v", i, g)
			case x > time.Second+20*time.Millisecond && g != 20*time.Millisecond:
				t.Fatalf("gap %d after the update = %v, want 20ms (at %v, prev %v)", i, g, x, cs[i-1].at.Sub(start))
			}
		}
		if len(cs) != 300 {
			t.Errorf("%d delivered, want 300", len(cs))
		}
		for _, m := range h.src.Messages() {
			for _, v := range m.Verbs {
				if strings.HasPrefix(v, "nak") {
					t.Fatalf("message %d was nak'd by the update: %v", m.ID, m.Verbs)
				}
			}
		}
		if got := testutil.ToFloat64(h.m.BucketCapacity); got != 500 {
			t.Errorf("capacity gauge %v", got)
		}
		changed := next
		changed.Source.Stream = "OTHER"
		if err := h.lane.Update(changed); !errors.Is(err, ErrRestartNeeded) {
			t.Errorf("changing the stream: %v, want ErrRestartNeeded", err)
		}
		changed = next
		changed.Bucket.FairKey = "subject:0"
		if err := h.lane.Update(changed); !errors.Is(err, ErrRestartNeeded) {
			t.Errorf("changing bucket.fair_key: %v, want ErrRestartNeeded", err)
		}
		// Whether the sink reports and gates its writes is read once, by
		// New (WireReporter, WireGater): an HTTP lane turned into a NATS one
		// in place kept releasing tasks a lead early, to a sink that does
		// not hold them (found by review).
		changed = next
		changed.Sink.Kind = config.SinkNATS
		if next.Sink.Kind == changed.Sink.Kind {
			changed.Sink.Kind = config.SinkHTTP
		}
		if err := h.lane.Update(changed); !errors.Is(err, ErrRestartNeeded) {
			t.Errorf("changing sink.kind: %v, want ErrRestartNeeded", err)
		}
	})
}
