package drain

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// memDedup is an in-memory Dedup for tests on the fake clock (the JetStream
// one, sources.KVDedup, is tested against a real server). failSeen and
// failRecord make it unreachable; ackedAtRecord notes, for each Record,
// whether the message was already acked (it must not be: record first).
type memDedup struct {
	mu                   sync.Mutex
	keys                 map[string]bool
	failSeen, failRecord bool
	seen, records        int
	src                  *sourcetest.Mem
	ackedAtRecord        int
}

func (d *memDedup) Seen(_ context.Context, key string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen++
	if d.failSeen {
		return false, errors.New("dedup store unreachable")
	}
	return d.keys[key], nil
}

func (d *memDedup) Record(_ context.Context, key string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.records++
	if d.src != nil {
		ackedAtRecord(d.src, key, &d.ackedAtRecord)
	}
	if d.failRecord {
		return errors.New("dedup store unreachable")
	}
	d.keys[key] = true
	return nil
}

// ackedAtRecord counts into n whether the message of key (MEM:<seq>) is
// already acked.
func ackedAtRecord(s *sourcetest.Mem, key string, n *int) {
	for _, m := range s.Messages() {
		if (&shaper.Message{Stream: sourcetest.MemStream, StreamSeq: uint64(m.ID + 1)}).Key() == key && m.State == sourcetest.Acked {
			*n++
		}
	}
}

func newDedupHarness(t *testing.T, sink *recSink, d *memDedup) *harness {
	t.Helper()
	h := newHarness(t, laneConfig(10), sink)
	d.src = h.src
	l, err := New("test", laneConfig(10), h.src, sink, WithWaiter(TimerWaiter{}), WithMetrics(h.m),
		WithDeadLetter(h.dead), WithDedup(d))
	if err != nil {
		t.Fatal(err)
	}
	h.lane = l
	return h
}

// TestLaneDedupSkipsDelivered: SPEC §3 Delivered-key dedup — of 10
// messages, the 4 whose keys the store already has are acked without a
// sink call (outcome duplicate_skipped); the other 6 are delivered, and
// their keys recorded before their acks.
func TestLaneDedupSkipsDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		d := &memDedup{keys: map[string]bool{"MEM:1": true, "MEM:4": true, "MEM:5": true, "MEM:10": true}}
		h := newDedupHarness(t, sink, d)
		h.src.Publish(10)
		h.lane.Start()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 6 {
			t.Errorf("%d sink calls, want 6 (4 keys already delivered)", len(cs))
		}
		for _, c := range cs {
			switch c.id {
			case "msg-0", "msg-3", "msg-4", "msg-9":
				t.Errorf("%s was sent, but its key was already delivered", c.id)
			}
		}
		if n := h.src.Count(sourcetest.Acked); n != 10 {
			t.Errorf("%d acked, want 10 (skipped duplicates are acked)", n)
		}
		if got := testutil.ToFloat64(h.m.Deliveries[shaper.OutcomeDuplicateSkipped]); got != 4 {
			t.Errorf("deliveries{duplicate_skipped} = %v, want 4", got)
		}
		if got := testutil.ToFloat64(h.m.Deliveries[shaper.OutcomeSuccess]); got != 6 {
			t.Errorf("deliveries{success} = %v, want 6", got)
		}
		if d.records != 6 || len(d.keys) != 10 {
			t.Errorf("%d records, %d keys; want 6 records, 10 keys", d.records, len(d.keys))
		}
		if d.ackedAtRecord != 0 {
			t.Errorf("%d keys recorded after their message was acked; the record comes first", d.ackedAtRecord)
		}
	})
}

// TestLaneDedupUnreachable: a store that fails loses nothing (G4): a failed
// lookup delivers, a failed record still acks.
func TestLaneDedupUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name       string
		seen, recd bool
	}{{"lookup fails", true, false}, {"record fails", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sink := &recSink{}
				d := &memDedup{keys: map[string]bool{}, failSeen: tc.seen, failRecord: tc.recd}
				h := newDedupHarness(t, sink, d)
				h.src.Publish(5)
				h.lane.Start()
				time.Sleep(2 * time.Second)
				synctest.Wait()
				h.stop(time.Second)
				if n := len(sink.snapshot()); n != 5 {
					t.Errorf("%d delivered, want 5", n)
				}
				if n := h.src.Count(sourcetest.Acked); n != 5 {
					t.Errorf("%d acked, want 5", n)
				}
				if n := len(h.dead.snapshot()); n != 0 {
					t.Errorf("%d dead letters, want 0", n)
				}
			})
		})
	}
}
