package drain

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// TestLaneQuotaHoldsOnlyWhenItBinds: under a backlog each window of the
// quota after the first replays the first one's spacing, so between two
// departures the quota frees its slot exactly when the pacer does. That is
// not a wait: the lane logs "quota spent" once per wait (three waits in
// 12 s of quota 100 per 5 s at 50/s: from 1.98 s, 6.982 s and 11.984 s), and the pacer is not held between the
// departures of a window (quotaUntil's paced rule).
func TestLaneQuotaHoldsOnlyWhenItBinds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(50)
		cfg.Rate.Quota.Count, cfg.Rate.Quota.Per = 100, 5*time.Second
		rec := &logRecorder{}
		h := &harness{t: t, src: sourcetest.NewMem(cfg.Source.AckWait), sink: sink, dead: &recSink{}, reg: prometheus.NewRegistry()}
		h.m = metrics.New(h.reg).Lane("test", float64(cfg.Rate.Limit))
		l, err := New("test", cfg, h.src, sink, WithWaiter(TimerWaiter{}), WithMetrics(h.m), WithDeadLetter(h.dead),
			WithLogger(slog.New(rec)))
		if err != nil {
			t.Fatal(err)
		}
		h.lane = l
		h.src.Publish(400)
		l.Start()
		time.Sleep(6 * time.Second) // inside the second window, between departures
		synctest.Wait()
		l.mu.Lock()
		held := l.pacer.Held()
		l.mu.Unlock()
		if held {
			t.Errorf("the pacer is held between two departures of the second window: the quota did not bind there")
		}
		time.Sleep(6 * time.Second)
		h.stop(time.Millisecond)
		if n := rec.count(slog.LevelInfo, "quota spent"); n != 3 {
			t.Errorf("%d \"quota spent\" lines in 12 s, want 3 (one per wait)", n)
		}
		if n := len(sink.snapshot()); n != 300 {
			t.Errorf("%d calls by 12 s, want 300 (100 from 0, 5.002 s and 10.004 s)", n)
		}
	})
}
