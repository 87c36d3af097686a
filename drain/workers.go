package drain

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Tasks run on goroutines that outlive one task (issue 15). A goroutine per
// task cost its creation and, every time, the growth of its stack from the
// initial size to what a sink call needs (runtime.newstack and copystack:
// ~5 % of the process's CPU at full speed, docs/performance.md). A departure
// whose task the departure loop does not run itself (follower.go) hands its
// message to an idle worker when one waits, or starts a new one;
// a worker idle for workerIdle exits, and Drain stops the rest. There are at
// most about max_in_flight of them (a worker is busy only while its task
// holds a slot) plus the few that are between two tasks.
//
// The hand-over wakes the worker as `go` would start a goroutine, so the
// cadence (G5: a slow task never delays the next departure) is unchanged.
const workerIdle = time.Second

// workers is a lane's pool of task goroutines.
type workers struct {
	work chan *shaper.Message // unbuffered: a send succeeds only to an idle worker
	stop chan struct{}        // closed by Drain once every task ended
	wg   sync.WaitGroup
	// started counts the workers started (tests: tasks reuse them).
	started atomic.Int64
}

func newWorkers() workers {
	return workers{work: make(chan *shaper.Message), stop: make(chan struct{})}
}

// startTask runs m's task (runTask) on an idle worker or a new one.
func (l *Lane) startTask(m *shaper.Message) {
	select {
	case l.workers.work <- m:
	default:
		l.workers.wg.Add(1)
		l.workers.started.Add(1)
		go l.worker(m)
	}
}

// worker runs m's task, then the tasks handed to it, until it has been idle
// for workerIdle or the lane stops. Its idle timer is not reset after every
// task (a timer-heap operation per message): when it fires, the worker
// checks how long it has really been idle and waits out the rest.
func (l *Lane) worker(m *shaper.Message) {
	defer l.workers.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	last := l.runTask(m)
	for {
		select {
		case m = <-l.workers.work:
			last = l.runTask(m)
		case <-idle.C: // it may have fired during the task: measure from its end
			if rest := workerIdle - time.Since(last); rest > 0 {
				idle.Reset(rest)
				continue
			}
			return
		case <-l.workers.stop:
			return
		}
	}
}

// stopWorkers ends the idle workers and waits for them; call after every
// task ended (Drain).
func (l *Lane) stopWorkers() {
	close(l.workers.stop)
	l.workers.wg.Wait()
	l.relay.wg.Wait() // the departure loop's goroutines (follower.go)
}
