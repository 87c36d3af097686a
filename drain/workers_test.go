package drain

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestLaneTasksReuseWorkers: departures hand their tasks to the goroutines
// of earlier tasks instead of starting one each (workers.go); tasks that
// overlap still run at once (G5), each on its own worker.
func TestLaneTasksReuseWorkers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		latency time.Duration // of each sink call; departures are 10 ms apart
		max     int64         // workers started, at most
	}{
		{"tasks one after the other", time.Millisecond, 1},
		{"three at once", 25 * time.Millisecond, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sink := &recSink{behave: func(call) (time.Duration, error) { return tc.latency, nil }}
				h := newHarness(t, laneConfig(100), sink)
				h.src.Publish(50)
				h.lane.Start()
				time.Sleep(time.Second)
				synctest.Wait()
				h.stop(time.Second)
				if n := len(sink.snapshot()); n != 50 {
					t.Fatalf("%d delivered, want 50", n)
				}
				if n := h.lane.workers.started.Load(); n > tc.max || n < 1 {
					t.Errorf("%d workers started for 50 tasks, want 1 to %d", n, tc.max)
				}
			})
		})
	}
}

// TestWorkerIdleExit: a worker exits once it has been idle for workerIdle,
// counted from the end of its last task (the timer is not reset per task,
// workers.go): tasks 0.6 s apart keep one worker, tasks 1.5 s apart start
// one each.
func TestWorkerIdleExit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   float64 // departures per second
		workers int64
	}{
		{"0.6 s apart", 1 / 0.6, 1},
		{"1.5 s apart", 1 / 1.5, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := laneConfig(tc.limit)
				cfg.Rate.Warmup.ColdFactor = 1
				sink := &recSink{}
				h := newHarness(t, cfg, sink)
				h.src.Publish(4)
				h.lane.Start()
				time.Sleep(7 * time.Second)
				synctest.Wait()
				h.stop(time.Second)
				if n := len(sink.snapshot()); n != 4 {
					t.Fatalf("%d delivered, want 4", n)
				}
				if n := h.lane.workers.started.Load(); n != tc.workers {
					t.Errorf("%d workers started, want %d", n, tc.workers)
				}
			})
		})
	}
}

// TestWorkerIdleAfterLongTask: the idle time counts from the end of the
// task, also when the idle timer fired during a task longer than
// workerIdle: after a 3 s task and 1.5 s without one, the worker is gone.
func TestWorkerIdleAfterLongTask(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(1 / 4.5) // departures at 0 s and 4.5 s
		cfg.Rate.Warmup.ColdFactor = 1
		cfg.Task.Timeout = 10 * time.Second
		first := true
		sink := &recSink{behave: func(call) (time.Duration, error) {
			if first {
				first = false
				return 3 * time.Second, nil
			}
			return 0, nil
		}}
		h := newHarness(t, cfg, sink)
		h.src.Publish(2)
		h.lane.Start()
		time.Sleep(6 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if n := len(sink.snapshot()); n != 2 {
			t.Fatalf("%d delivered, want 2", n)
		}
		if n := h.lane.workers.started.Load(); n != 2 {
			t.Errorf("%d workers started, want 2 (the first idle 1.5 s after its task ended)", n)
		}
	})
}
