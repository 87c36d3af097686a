package drain

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// slowWireSink reports each request's wire after a delay that alternates
// between longer than the lane's interval and much shorter, and records the
// departure and the report of each.
type slowWireSink struct {
	mu              sync.Mutex
	n               int
	departed, wired []time.Time
	long, short     time.Duration
}

func (s *slowWireSink) ReportsWire() bool { return true }

func (s *slowWireSink) Send(ctx context.Context, m *shaper.Message) error {
	s.mu.Lock()
	d := s.short
	if s.n%2 == 0 {
		d = s.long
	}
	s.n++
	s.mu.Unlock()
	time.Sleep(d)
	now := time.Now()
	s.mu.Lock()
	s.departed, s.wired = append(s.departed, m.Departed), append(s.wired, now)
	s.mu.Unlock()
	if fn := shaper.WireFrom(ctx); fn != nil {
		fn(now)
	}
	return nil
}

// TestLaneWaitsForTheWire: with a sink that reports the wire
// (WireReporter), a departure never leaves before the previous request's
// report (SPEC G1 at the wire: the departures are what reaches the
// downstream), and a report that comes after the pacer's time wakes the
// loop — the next departure follows it within the pacer's floor, not after
// the maxWireWait bound; min_spacing holds throughout.
func TestLaneWaitsForTheWire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(100) // 10 ms interval
		sink := &slowWireSink{long: 15 * time.Millisecond, short: time.Millisecond}
		src := sourcetest.NewMem(cfg.Source.AckWait)
		l, err := New("test", cfg, src, sink, WithWaiter(TimerWaiter{}),
			WithMetrics(metrics.New(prometheus.NewRegistry()).Lane("test", 100)))
		if err != nil {
			t.Fatal(err)
		}
		const n = 40
		src.Publish(n)
		l.Start()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		l.Drain(ctx)
		cancel()
		src.Close()

		sink.mu.Lock()
		defer sink.mu.Unlock()
		if len(sink.departed) != n {
			t.Fatalf("%d requests, want %d", len(sink.departed), n)
		}
		for i := 1; i < n; i++ {
			dep, prevWire := sink.departed[i], sink.wired[i-1]
			if dep.Before(prevWire) {
				t.Errorf("departure %d left %v before the previous request's wire report", i, prevWire.Sub(dep))
			}
			if gap := dep.Sub(sink.departed[i-1]); gap >= 40*time.Millisecond {
				t.Errorf("departure %d left %v after the previous one (its report came after %v): the report did not wake the loop",
					i, gap, prevWire.Sub(sink.departed[i-1]))
			}
			if gap := dep.Sub(sink.departed[i-1]); gap < time.Duration(0.95*float64(10*time.Millisecond)) {
				t.Errorf("departure %d left %v after the previous one, under min_spacing", i, gap)
			}
		}
	})
}
