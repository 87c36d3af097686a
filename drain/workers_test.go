package drain

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/shaper"
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
// counted from the end of its last task (the pool's one timer ends the
// workers idle that long, workers.go): tasks 0.6 s apart keep one worker,
// tasks 1.5 s apart start one each, and after a 3 s task and 1.5 s without
// one the worker is gone.
func TestWorkerIdleExit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   float64       // departures per second
		msgs    int           // published at once
		first   time.Duration // the first sink call's latency; the others return at once
		span    time.Duration
		workers int64
	}{
		{"0.6 s apart", 1 / 0.6, 4, 0, 7 * time.Second, 1},
		{"1.5 s apart", 1 / 1.5, 4, 0, 7 * time.Second, 4},
		{"1.5 s after a 3 s task", 1 / 4.5, 2, 3 * time.Second, 6 * time.Second, 2},
	} {
		// Every case's last task ended over a second before the span's
		// end: by then every worker has ended, without Drain.
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := laneConfig(tc.limit)
				cfg.Rate.Warmup.ColdFactor = 1
				cfg.Task.Timeout = 10 * time.Second
				sink := &recSink{behave: func(c call) (time.Duration, error) {
					if c.id == "msg-0" {
						return tc.first, nil
					}
					return 0, nil
				}}
				h := newHarness(t, cfg, sink)
				h.src.Publish(tc.msgs)
				h.lane.Start()
				time.Sleep(tc.span)
				synctest.Wait()
				if started, ended := h.lane.workers.started.Load(), h.lane.workers.ended.Load(); ended != started {
					t.Fatalf("%d of %d workers ended after a second idle, want all (the rest would hold Drain)", ended, started)
				}
				h.stop(time.Second)
				if n := len(sink.snapshot()); n != tc.msgs {
					t.Fatalf("%d delivered, want %d", n, tc.msgs)
				}
				if n := h.lane.workers.started.Load(); n != tc.workers {
					t.Errorf("%d workers started, want %d", n, tc.workers)
				}
			})
		})
	}
}

// TestWorkersReapKeepsNoWorkerTwice: reaping the oldest idle worker ends it
// (its channel closes), keeps the younger one, and leaves no copy of a
// moved worker past the stack's end.
func TestWorkersReapKeepsNoWorkerTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &workers{}
		old := &worker{work: make(chan *shaper.Message, 1), since: time.Now()}
		time.Sleep(600 * time.Millisecond)
		young := &worker{work: make(chan *shaper.Message, 1), since: time.Now()}
		p.idle = []*worker{old, young}
		p.armed = true
		p.reaper = time.AfterFunc(time.Hour, p.reap)
		time.Sleep(500 * time.Millisecond) // old idle 1.1 s, young 0.5 s
		p.reap()
		if _, open := <-old.work; open {
			t.Error("the worker idle 1.1 s was not ended")
		}
		if len(p.idle) != 1 || p.idle[0] != young {
			t.Fatalf("idle stack %v, want the younger worker alone", p.idle)
		}
		for i, w := range p.idle[len(p.idle):cap(p.idle)] {
			if w != nil {
				t.Errorf("a worker left past the stack's end, at %d", len(p.idle)+i)
			}
		}
		p.mu.Lock()
		p.stopped = true
		p.reaper.Stop()
		p.mu.Unlock()
	})
}
