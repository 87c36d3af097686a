package drain

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// slowWireSink reports each request's wire after a delay that alternates
// between long and short, exact or not (shaper.WithWire), and records the
// departure and the report of each.
type slowWireSink struct {
	mu              sync.Mutex
	n               int
	departed, wired []time.Time
	long, short     time.Duration
	exact           bool
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
		fn(now, s.exact)
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
		sink := slowWire()
		runSlowWire(t, laneConfig(100), sink)
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
		sink := slowWire()
		m := runSlowWire(t, laneConfig(100), sink)
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

// TestLaneExactWireReports: the lane hands a report's exactness to the
// pacer (Lane.wired, Pacer.Wire). At 5,000/s every request reaches the wire
// 199 µs after it left: reported exact, that is within its tile and moves
// nothing, and the departures keep 200 µs; reported not exact, each report
// is 19 µs past 0.9 interval and moves the schedule (cause wire).
func TestLaneExactWireReports(t *testing.T) {
	const n = 40
	iv := shaper.Limit(5000).Interval()
	for _, exact := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			sink := &slowWireSink{long: 199 * time.Microsecond, short: 199 * time.Microsecond, exact: exact}
			m := runSlowWire(t, laneConfig(5000), sink)
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if len(sink.departed) != n {
				t.Fatalf("exact %v: %d requests, want %d", exact, len(sink.departed), n)
			}
			wire := testutil.ToFloat64(m.ForgivenWire)
			span := sink.departed[n-1].Sub(sink.departed[0])
			switch {
			case exact && (wire != 0 || span != (n-1)*iv):
				t.Errorf("exact reports 199 µs after departure: forgiven (wire) %v s, %d departures spanned %v; want 0 and %v",
					wire, n, span, (n-1)*iv)
			case !exact && wire <= 0:
				t.Errorf("reports that are not exact, 199 µs after departure: forgiven (wire) %v s, want > 0", wire)
			}
		})
	}
}

// slowWire is the sink of TestLaneWaitsForTheWire: reports 15 ms and 1 ms
// after departure in turn, at 100/s (10 ms interval).
func slowWire() *slowWireSink {
	return &slowWireSink{long: 15 * time.Millisecond, short: time.Millisecond}
}

// runSlowWire runs 40 messages through a lane of cfg with sink, inside a
// synctest bubble, and drains it.
func runSlowWire(t *testing.T, cfg config.Lane, sink *slowWireSink) *metrics.Lane {
	t.Helper()
	src := sourcetest.NewMem(cfg.Source.AckWait)
	m := metrics.New(prometheus.NewRegistry()).Lane("test", float64(cfg.Rate.Limit))
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
	return m
}
