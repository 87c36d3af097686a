package drain

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// pinSource is a sourcetest.Mem in a pinned-client group (PinKeeper): while not
// active its pulls get nothing, as the server's would.
type pinSource struct {
	*sourcetest.Mem
	active atomic.Bool
	mu     sync.Mutex
	keeps  []time.Time // KeepPin calls
	first  time.Time   // the first message delivered
}

func (p *pinSource) Standby() bool { return true }
func (p *pinSource) Active() bool  { return p.active.Load() }

func (p *pinSource) KeepPin(context.Context) error {
	p.mu.Lock()
	p.keeps = append(p.keeps, time.Now())
	p.mu.Unlock()
	return nil
}

func (p *pinSource) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	if !p.active.Load() {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return nil
	}
	return p.Mem.Fetch(ctx, max, func(m *shaper.Message) {
		p.mu.Lock()
		if p.first.IsZero() {
			p.first = time.Now()
		}
		p.mu.Unlock()
		deliver(m)
	})
}

func newPinLane(t *testing.T, limit float64, capacity int, sink *recSink) (*Lane, *pinSource) {
	t.Helper()
	cfg := laneConfig(limit)
	cfg.Bucket.Capacity = capacity
	src := &pinSource{Mem: sourcetest.NewMem(cfg.Source.AckWait)}
	m := metrics.New(prometheus.NewRegistry()).Lane("test", limit)
	l, err := New("test", cfg, src, sink, WithWaiter(TimerWaiter{}), WithMetrics(m), WithDeadLetter(&recSink{}))
	if err != nil {
		t.Fatal(err)
	}
	return l, src
}

func drainPinLane(l *Lane, src *pinSource) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.Drain(ctx)
	src.Close()
}

// TestStandbyTakeoverWaitsOneInterval: a replica that becomes the active
// one of a standby lane departs its first message one interval after it
// became active, not at once: it cannot know when the replica before it
// departed last (SPEC G1 across the takeover, docs/scaling.md).
func TestStandbyTakeoverWaitsOneInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		l, src := newPinLane(t, 10, 100, sink)
		src.Publish(5)
		l.Start()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := len(sink.snapshot()); n != 0 {
			t.Fatalf("%d departures while not active", n)
		}
		src.active.Store(true)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		drainPinLane(l, src)
		cs := sink.snapshot()
		if len(cs) != 5 {
			t.Fatalf("%d calls after the takeover, want 5", len(cs))
		}
		// The first departure waits one interval (100 ms) from the moment
		// the lane saw itself active with a message at the head.
		src.mu.Lock()
		first := cs[0].at.Sub(src.first)
		src.mu.Unlock()
		if first != 100*time.Millisecond {
			t.Errorf("first departure %v after the first message came, want one interval (100ms)", first)
		}
		for i := 1; i < len(cs); i++ {
			if g := cs[i].at.Sub(cs[i-1].at); g != 100*time.Millisecond {
				t.Errorf("gap %d = %v, want 100ms", i, g)
			}
		}
	})
}

// TestStandbyKeepsPinWhileFull: the active replica renews its pin every
// keepPinEvery, also while its bucket is full and it fetches nothing (at
// 10/s a bucket of 100 pulls again only after 25 departures, 2.5 s: longer
// than half the server's pinned TTL).
func TestStandbyKeepsPinWhileFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		l, src := newPinLane(t, 10, 100, sink)
		src.active.Store(true)
		src.Publish(1000)
		start := time.Now()
		l.Start()
		time.Sleep(6 * time.Second)
		synctest.Wait()
		drainPinLane(l, src)
		src.mu.Lock()
		keeps := append([]time.Time{start}, src.keeps...)
		src.mu.Unlock()
		if len(keeps) < 10 {
			t.Fatalf("%d KeepPin calls in 6 s, want one every %v", len(keeps)-1, keepPinEvery)
		}
		for i := 1; i < len(keeps); i++ {
			if g := keeps[i].Sub(keeps[i-1]); g > keepPinEvery {
				t.Errorf("KeepPin gap %v, want ≤ %v", g, keepPinEvery)
			}
		}
	})
}

// TestStandbyLostPinHandsBack: a replica that lost the pin while alive (cut
// off longer than the pinned TTL) hands back what its bucket holds and
// departs nothing more beyond what was already leaving: another replica
// paces the lane now.
func TestStandbyLostPinHandsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		l, src := newPinLane(t, 10, 100, sink)
		src.active.Store(true)
		src.Publish(1000)
		l.Start()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		src.active.Store(false)
		lost := time.Now()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		after := 0
		for _, c := range sink.snapshot() {
			if c.at.After(lost.Add(keepPinEvery)) {
				after++
			}
		}
		if after > 0 {
			t.Errorf("%d departures more than %v after the pin was lost", after, keepPinEvery)
		}
		if n := l.bucket.Len(); n != 0 {
			t.Errorf("bucket holds %d after the pin was lost, want 0 (handed back)", n)
		}
		drainPinLane(l, src)
		if n := src.Count(sourcetest.Pending); n != 0 {
			t.Errorf("%d messages still held after the pin was lost", n)
		}
	})
}
