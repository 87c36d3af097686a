package drain

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// stallingSource is a source whose connection check, which the departure
// loop makes before each departure (awaitConnected), takes stall once: at
// its call number at. The loop is away from its schedule meanwhile, as a
// thread the machine stalled, a task run in line past its turn or a
// follower that woke late would be, with a message and a task slot ready.
type stallingSource struct {
	Source
	calls atomic.Int64
	at    int64
	stall time.Duration
}

func (s *stallingSource) Connected() bool {
	if s.calls.Add(1) == s.at {
		time.Sleep(s.stall)
	}
	return true
}

// runStalled runs n messages through a lane of cfg on the fake clock
// whose loop stalls for stall before departure 10 (stallingSource), drains
// it after 1.5 s and returns the harness and the sink's calls.
func runStalled(t *testing.T, cfg config.Lane, stall time.Duration, n int) (*harness, []call) {
	t.Helper()
	sink := &recSink{}
	h := newHarness(t, cfg, sink)
	h.lane.src = &stallingSource{Source: h.src, at: 11, stall: stall}
	h.src.Publish(n)
	h.lane.Start()
	time.Sleep(1500 * time.Millisecond)
	synctest.Wait()
	h.stop(time.Second)
	return h, sink.snapshot()
}

// TestLaneLoopDelayIsLateness: under a backlog, a departure loop that comes
// back late with its work ready (readySince) is late, not idle: the
// lateness is made up to MakeUpLag (0.9 interval at 100/s, 9 ms) and the
// rest is reported forgiven (SPEC G1: a waiter that wakes late must not
// cost rate). Stamping readiness when the loop came back lost all of it
// unreported (TestHTTPWireRate's ledger at the departures).
func TestLaneLoopDelayIsLateness(t *testing.T) {
	for _, tc := range []struct {
		stall, forgiven time.Duration
	}{
		{15 * time.Millisecond, 0},                    // 5 ms late: all made up
		{25 * time.Millisecond, 6 * time.Millisecond}, // 15 ms late: 9 ms made up, 6 ms forgiven
	} {
		t.Run(tc.stall.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, cs := runStalled(t, laneConfig(100), tc.stall, 100)
				if len(cs) != 100 {
					t.Fatalf("%d calls, want 100", len(cs))
				}
				// Departure 10 (0-based) leaves after the stall, 10 ms after
				// departure 9 plus the stall's excess over an interval.
				if late := cs[10].at.Sub(cs[9].at) - 10*time.Millisecond; late != tc.stall-10*time.Millisecond {
					t.Errorf("departure 10 left %v after its time, want %v (the stall's excess)", late, tc.stall-10*time.Millisecond)
				}
				span := cs[99].at.Sub(cs[0].at)
				if want := 99*10*time.Millisecond + tc.forgiven; span != want {
					t.Errorf("100 departures spanned %v, want 99 intervals + %v forgiven = %v: lateness under MakeUpLag is made up", span, tc.forgiven, want)
				}
				got := time.Duration(testutil.ToFloat64(h.m.ForgivenLate) * float64(time.Second))
				if d := got - tc.forgiven; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("lateness forgiven %v, want %v (shaper_departure_lateness_forgiven_seconds_total{cause=late})", got, tc.forgiven)
				}
				for i := 1; i < len(cs); i++ {
					if g := cs[i].at.Sub(cs[i-1].at); g < 9500*time.Microsecond {
						t.Fatalf("departures %d and %d %v apart, under min_spacing 0.95 intervals", i-1, i, g)
					}
				}
			})
		})
	}
}

// TestReadySince: the work of a departure that waited for nothing was ready
// at the previous departure, or later when the head was admitted after it
// or a task slot was freed after all were taken; before the first
// departure it is ready when the loop looks (the zero time). Later than
// the truth would drop lateness unreported; earlier would turn idle time
// into lateness to make up (SPEC G2: waiting earns no credit).
func TestReadySince(t *testing.T) {
	l := &Lane{}
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	old := &shaper.Message{Admitted: t0.Add(-time.Second)}
	if got := l.readySince(old, time.Time{}); !got.IsZero() {
		t.Errorf("before the first departure: %v, want the zero time", got)
	}
	l.lastDeparture = t0
	for _, tc := range []struct {
		name     string
		admitted time.Time
		unfull   time.Time
		want     time.Time
	}{
		{"a backlog", t0.Add(-time.Second), time.Time{}, t0},
		{"the head admitted after the departure", t0.Add(3 * time.Millisecond), time.Time{}, t0.Add(3 * time.Millisecond)},
		{"a slot freed after the departure", t0.Add(-time.Second), t0.Add(4 * time.Millisecond), t0.Add(4 * time.Millisecond)},
		{"both, the later wins", t0.Add(5 * time.Millisecond), t0.Add(4 * time.Millisecond), t0.Add(5 * time.Millisecond)},
		{"a slot freed before the departure", t0.Add(-time.Second), t0.Add(-time.Millisecond), t0},
	} {
		if got := l.readySince(&shaper.Message{Admitted: tc.admitted}, tc.unfull); !got.Equal(tc.want) {
			t.Errorf("%s: ready at %v, want %v", tc.name, got.Sub(t0), tc.want.Sub(t0))
		}
	}
}

// TestSemaphoreUnfull: acquire reports whether it waited, and when all
// slots were last full and one was freed (readySince).
func TestSemaphoreUnfull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := newSemaphore(2)
		if unfull, waited, _, ok := s.acquire(ctx, nil); !ok || waited || !unfull.IsZero() {
			t.Fatalf("first acquire: %v %v %v, want no wait and never full", unfull, waited, ok)
		}
		time.Sleep(time.Millisecond)
		s.acquire(ctx, nil) // full now
		time.Sleep(time.Millisecond)
		s.release() // all were taken: free from now
		freed := time.Now()
		time.Sleep(time.Millisecond)
		if unfull, waited, _, _ := s.acquire(ctx, nil); waited || !unfull.Equal(freed) {
			t.Errorf("after a release from full: unfull %v, waited %v; want %v, no wait", unfull, waited, freed)
		}
		go func() { time.Sleep(2 * time.Millisecond); s.release() }()
		if _, waited, _, ok := s.acquire(ctx, nil); !waited || !ok {
			t.Errorf("with every slot taken: waited %v ok %v, want a wait", waited, ok)
		}
		s.release()
		before := time.Now()
		time.Sleep(time.Millisecond)
		s.release() // not full: no new instant
		if unfull, _, _, _ := s.acquire(ctx, nil); unfull.After(before) {
			t.Errorf("a release that was not from full moved unfull to %v", unfull)
		}
		s.acquire(ctx, nil)
		time.Sleep(time.Millisecond)
		s.setLimit(3) // a higher limit frees a slot of a full semaphore
		if unfull, _, _, _ := s.acquire(ctx, nil); !unfull.Equal(time.Now()) {
			t.Errorf("setLimit from full: unfull %v, want now", unfull)
		}
	})
}

// TestReadySinceQuotaWait: a quota wait the loop was away for (rate.quota
// 10 per 200 ms at 100/s: departures 0-9 by 90 ms, the quota frees at
// 202 ms) is a wait, not lateness: only the time the loop came back after
// the quota's end is late, made up to 9 ms, the rest forgiven (found by
// review: the whole wait was reported as forgiven lateness).
func TestReadySinceQuotaWait(t *testing.T) {
	for _, tc := range []struct {
		stall, forgiven time.Duration
	}{
		{150 * time.Millisecond, 29 * time.Millisecond}, // back at 240 ms: 38 ms late
		{113 * time.Millisecond, 0},                     // back at 203 ms: 1 ms late, made up
	} {
		t.Run(tc.stall.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := laneConfig(100)
				cfg.Rate.Quota.Count, cfg.Rate.Quota.Per = 10, 200*time.Millisecond
				h, cs := runStalled(t, cfg, tc.stall, 12)
				if n := len(cs); n != 12 {
					t.Fatalf("%d departures, want 12", n)
				}
				got := time.Duration(testutil.ToFloat64(h.m.ForgivenLate) * float64(time.Second))
				if d := got - tc.forgiven; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("forgiven lateness %v, want %v: the quota's wait (90 to 202 ms) is no lateness", got, tc.forgiven)
				}
			})
		})
	}
}
