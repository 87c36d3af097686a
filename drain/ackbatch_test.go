package drain

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// TestAckBatchTiming: an ack that follows the last one sent by
// ackBatchDelay or more is sent at once; the acks that come sooner are sent
// together, in order, by the first ack added ackBatchDelay or more after the
// batch's first (on the caller), or, when none comes, ackBatchLate after it
// (the timer); a full batch is sent at once.
func TestAckBatchTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		type sent struct {
			id int
			at time.Duration
		}
		var got []sent
		t0 := time.Now()
		ids := map[*shaper.Message]int{}
		b := &ackBatch{send: func(_ context.Context, m *shaper.Message) {
			mu.Lock()
			got = append(got, sent{ids[m], time.Since(t0)})
			mu.Unlock()
		}}
		msg := func(id int) *shaper.Message {
			m := &shaper.Message{}
			mu.Lock()
			ids[m] = id
			mu.Unlock()
			return m
		}
		check := func(what string, want ...sent) {
			t.Helper()
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			if len(got) != len(want) {
				t.Fatalf("%s: sent %v, want %v", what, got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("%s: ack %d is %v, want %v", what, i, got[i], want[i])
				}
			}
		}
		d := ackBatchDelay
		b.add(msg(1), time.Now()) // sent at once; the next ones wait
		check("first ack", sent{1, 0})
		time.Sleep(d / 4)
		b.add(msg(2), time.Now())
		time.Sleep(d / 2)
		b.add(msg(3), time.Now())
		// No ack comes after them: the timer sends them, ackBatchLate
		// after the batch's first.
		late := d/4 + ackBatchLate
		time.Sleep(late - d/4*3 - time.Nanosecond)
		check("before the timer", sent{1, 0})
		time.Sleep(time.Nanosecond)
		s123 := []sent{{1, 0}, {2, late}, {3, late}}
		check("at the timer", s123...)
		// A batch whose first ack is ackBatchDelay old leaves with the ack
		// that finds it so, at that instant, on the caller.
		time.Sleep(d / 2)
		b.add(msg(4), time.Now()) // the last batch left d/2 ago: it waits
		time.Sleep(d - time.Nanosecond)
		b.add(msg(5), time.Now())
		check("a batch younger than ackBatchDelay", s123...)
		time.Sleep(time.Nanosecond)
		at := late + d/2 + d
		b.add(msg(6), time.Now())
		mu.Lock()
		if len(got) != 6 { // sent by the add itself, no timer, no wait
			t.Errorf("the batch was not sent in line by the ack that found it ackBatchDelay old: %v", got)
		}
		mu.Unlock()
		s1to6 := append(s123, sent{4, at}, sent{5, at}, sent{6, at})
		check("in line", s1to6...)
		// Sparse acks (one per ackBatchDelay) each leave at once.
		time.Sleep(d)
		b.add(msg(7), time.Now())
		time.Sleep(d)
		b.add(msg(8), time.Now())
		check("sparse acks", append(s1to6, sent{7, at + d}, sent{8, at + 2*d})...)
		// A full batch leaves at once, without waiting for the timer.
		mu.Lock()
		got = got[:0]
		mu.Unlock()
		t0 = time.Now()
		for i := range ackBatchMax {
			b.add(msg(i), time.Now())
		}
		mu.Lock()
		if len(got) != ackBatchMax {
			t.Errorf("%d of a full batch of %d sent at once", len(got), ackBatchMax)
		}
		mu.Unlock()
		time.Sleep(2 * d)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(got) != ackBatchMax {
			t.Errorf("%d acks sent in all, want %d", len(got), ackBatchMax)
		}
	})
}

// fetchSpy wraps a lane's source and records, at every pull, how many acks
// the lane still held back.
type fetchSpy struct {
	*sourcetest.Mem
	lane    *Lane
	mu      sync.Mutex
	pending []int
}

func (s *fetchSpy) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	s.lane.acks.mu.Lock()
	n := len(s.lane.acks.q)
	s.lane.acks.mu.Unlock()
	s.mu.Lock()
	s.pending = append(s.pending, n)
	s.mu.Unlock()
	return s.Mem.Fetch(ctx, max, deliver)
}

// TestLaneAcksBeforePull: the lane sends its held acks before every pull
// request, so that the server counts those messages out of max_ack_pending
// before it serves the pull (ackbatch.go); and Drain returns with every ack
// sent.
func TestLaneAcksBeforePull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(100)
		cfg.Bucket.Capacity = 4 // a pull after every departure (fetchLowWater 1)
		// Each ack is queued 2 ms after its departure, 8 ms before the next
		// departure's pull and ackBatchDelay would send it.
		sink := &recSink{behave: func(call) (time.Duration, error) { return 2 * time.Millisecond, nil }}
		mem := sourcetest.NewMem(cfg.Source.AckWait)
		spy := &fetchSpy{Mem: mem}
		l, err := New("test", cfg, spy, sink, WithWaiter(TimerWaiter{}))
		if err != nil {
			t.Fatal(err)
		}
		spy.lane = l
		mem.Publish(30)
		l.Start()
		time.Sleep(time.Second)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		l.Drain(ctx)
		if acked, d := mem.Count(sourcetest.Acked), l.delivered.Load(); acked != int(d) || acked != 30 {
			t.Errorf("%d acked when Drain returned, %d delivered, want 30 each", acked, d)
		}
		mem.Close()
		spy.mu.Lock()
		defer spy.mu.Unlock()
		if len(spy.pending) < 10 {
			t.Fatalf("only %d pulls", len(spy.pending))
		}
		for i, n := range spy.pending {
			if n != 0 {
				t.Errorf("pull %d issued with %d acks held back, want 0", i, n)
			}
		}
	})
}

// TestLaneDrainSendsHeldAcks: a task that ends after the last pull (its
// sink call outlasts the pull's expiry) has its ack sent before Drain
// returns, not ackBatchDelay later: the caller closes the connection then.
func TestLaneDrainSendsHeldAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(call) (time.Duration, error) { return 1500 * time.Millisecond, nil }}
		// 1 ms apart: the first ack is sent at once, the second is held.
		h := newHarness(t, laneConfig(1000), sink)
		h.src.Publish(2)
		h.lane.Start()
		time.Sleep(10 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h.lane.Drain(ctx)
		if acked := h.src.Count(sourcetest.Acked); acked != 2 {
			t.Errorf("%d acked when Drain returned, want 2", acked)
		}
		h.src.Close()
	})
}

// TestLaneAcksBatched: at 1,000/s the acks of successful deliveries leave
// in batches of about ackBatchDelay's worth, not one send per delivery; at
// 10/s each leaves the instant its task ends (the task hands its end
// instant to the batch: a wrong one holds them for ackBatchDelay).
func TestLaneAcksBatched(t *testing.T) {
	for _, tc := range []struct {
		rate      float64
		msgs      int
		span      time.Duration
		instants  int  // at most this many send instants
		immediate bool // every ack sent the instant its sink call returned
	}{
		{1000, 200, time.Second, 60, false}, // 200 ms of deliveries: ~20 batches, plus the sends before pulls
		{10, 20, 3 * time.Second, 20, true},
	} {
		t.Run(fmt.Sprintf("%v/s", tc.rate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sink := &recSink{}
				cfg := laneConfig(tc.rate)
				cfg.Rate.Warmup.ColdFactor = 1
				h := newHarness(t, cfg, sink)
				var mu sync.Mutex
				instants := map[time.Time]int{} // acks sent at each instant
				send := h.lane.acks.send
				h.lane.acks.send = func(ctx context.Context, m *shaper.Message) {
					mu.Lock()
					instants[time.Now()]++
					mu.Unlock()
					send(ctx, m)
				}
				h.src.Publish(tc.msgs)
				h.lane.Start()
				time.Sleep(tc.span)
				synctest.Wait()
				h.stop(time.Second)
				if n := h.src.Count(sourcetest.Acked); n != tc.msgs {
					t.Fatalf("%d acked, want %d", n, tc.msgs)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(instants) > tc.instants {
					t.Errorf("acks sent at %d instants for %d deliveries, want at most %d", len(instants), tc.msgs, tc.instants)
				}
				if tc.immediate {
					for _, c := range sink.snapshot() {
						if instants[c.at] != 1 {
							t.Errorf("the ack of %s was not sent the instant its sink call returned", c.id)
						}
					}
				}
			})
		})
	}
}
