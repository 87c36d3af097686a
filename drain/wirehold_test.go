package drain

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
		fn(now, false)
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
		sink, _ := runSlowWire(t)
		const n = 40

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

// TestLaneCountsForgivenLateness: what a lane's departures lack of the
// limit is what shaper_departure_lateness_forgiven_seconds_total reports:
// here every other request reaches the wire 15 ms after it left (at
// 100/s), each such report pushes the schedule (cause wire), and the 40
// departures span (40 − 1) intervals plus the time given up plus the lag
// still being made up at the end.
func TestLaneCountsForgivenLateness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink, m := runSlowWire(t)
		const n = 40

		sink.mu.Lock()
		defer sink.mu.Unlock()
		late, wire := testutil.ToFloat64(m.ForgivenLate), testutil.ToFloat64(m.ForgivenWire)
		span := sink.departed[n-1].Sub(sink.departed[0])
		given := span - (n-1)*10*time.Millisecond
		t.Logf("span %v: %v over (n − 1) intervals; forgiven late %.6f s, wire %.6f s", span, given, late, wire)
		if wire <= 0 {
			t.Errorf("forgiven (wire) %v s, want > 0: the late reports pushed the schedule", wire)
		}
		// The lag still being made up after the last departure is lost
		// too, not forgiven: at most MakeUpLag (9 ms).
		lag := shaper.MakeUpLag(10*time.Millisecond, 0, shaper.DefaultMinSpacing)
		if got := time.Duration((late + wire) * float64(time.Second)); got > given+time.Microsecond || got < given-lag {
			t.Errorf("forgiven %v in all, want the %v the departures lost, less at most the %v of lag being made up", got, given, lag)
		}
	})
}

// runSlowWire runs 40 messages through a lane at 100/s whose sink reports
// the wire 15 ms and 1 ms after departure in turn (slowWireSink), inside a
// synctest bubble, and drains it.
func runSlowWire(t *testing.T) (*slowWireSink, *metrics.Lane) {
	t.Helper()
	cfg := laneConfig(100) // 10 ms interval
	sink := &slowWireSink{long: 15 * time.Millisecond, short: time.Millisecond}
	src := sourcetest.NewMem(cfg.Source.AckWait)
	m := metrics.New(prometheus.NewRegistry()).Lane("test", 100)
	l, err := New("test", cfg, src, sink, WithWaiter(TimerWaiter{}), WithMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	src.Publish(40)
	l.Start()
	time.Sleep(5 * time.Second)
	synctest.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	l.Drain(ctx)
	cancel()
	src.Close()
	return sink, m
}
