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
// message to the idle worker that went idle last, or starts a new one; a
// worker idle for workerIdle exits, and Drain stops the rest. There are at
// most about max_in_flight of them (a worker is busy only while its task
// holds a slot) plus the few that are between two tasks.
//
// An idle worker waits on a channel of its own, with no timer: a worker
// that waited in a select on the hand-over, its idle timer and the lane's
// stop took the runtime's locks of three channels and blocked and
// unblocked its timer at every task (runtime.selectgo, blockTimerChan,
// unblockTimerChan: a third of the runtime locks the process took at full
// speed, docs/performance.md, session 35). The idle workers are a stack
// (the last one idle takes the next task, so the others age); one timer
// per lane, armed only while a worker is idle, ends those idle for
// workerIdle, from the bottom of the stack.
//
// The hand-over wakes the worker as `go` would start a goroutine, so the
// cadence (G5: a slow task never delays the next departure) is unchanged.
const workerIdle = time.Second

// workers is a lane's pool of task goroutines.
type workers struct {
	mu      sync.Mutex
	idle    []*worker   // the idle workers, the last one idle on top
	reaper  *time.Timer // ends the workers idle for workerIdle; armed while idle is not empty
	armed   bool        // reaper runs
	stopped bool        // Drain stopped the pool: a worker that ends its task exits
	wg      sync.WaitGroup
	// started and ended count the workers started and ended (tests: tasks
	// reuse them, and an idle worker ends).
	started, ended atomic.Int64
}

// worker is one task goroutine as the pool sees it while it is idle.
type worker struct {
	work  chan *shaper.Message // the next task; closed to end the worker
	since time.Time            // when its last task ended
}

// startTask runs m's task (runTask) on the worker that went idle last, or
// on a new one.
func (l *Lane) startTask(m *shaper.Message) {
	p := &l.workers
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.work <- m // buffered: the worker waits for it alone
		return
	}
	p.mu.Unlock()
	p.wg.Add(1)
	p.started.Add(1)
	go l.worker(m)
}

// worker runs m's task, then the tasks handed to it, until it has been idle
// for workerIdle (reap) or the pool stops.
func (l *Lane) worker(m *shaper.Message) {
	p := &l.workers
	defer p.wg.Done()
	defer p.ended.Add(1)
	w := &worker{work: make(chan *shaper.Message, 1)}
	for {
		end := l.runTask(m)
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return
		}
		w.since = end
		p.idle = append(p.idle, w)
		if !p.armed {
			p.armed = true
			armTimer(&p.reaper, workerIdle, p.reap)
		}
		p.mu.Unlock()
		var ok bool
		if m, ok = <-w.work; !ok {
			return
		}
	}
}

// reap ends the workers idle for workerIdle or more (the bottom of the
// stack), and arms the timer again for the next one to age, if any.
func (p *workers) reap() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.armed || p.stopped {
		return
	}
	now := time.Now()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].since) >= workerIdle {
		close(p.idle[n].work)
		p.idle[n] = nil
		n++
	}
	left := copy(p.idle, p.idle[n:])
	clear(p.idle[left:]) // the moved workers' old places
	p.idle = p.idle[:left]
	if len(p.idle) == 0 {
		p.armed = false
		return
	}
	p.reaper.Reset(workerIdle - now.Sub(p.idle[0].since))
}

// stopWorkers ends the idle workers and waits for them; call after every
// task ended (Drain).
func (l *Lane) stopWorkers() {
	p := &l.workers
	p.mu.Lock()
	p.stopped = true
	for i, w := range p.idle {
		close(w.work)
		p.idle[i] = nil
	}
	p.idle = nil
	if p.reaper != nil {
		p.reaper.Stop()
	}
	p.mu.Unlock()
	p.wg.Wait()
	l.relay.wg.Wait() // the departure loop's goroutines (follower.go)
}

// armTimer arms *t to call f after d, making the timer on first use.
func armTimer(t **time.Timer, d time.Duration, f func()) {
	if *t == nil {
		*t = time.AfterFunc(d, f)
		return
	}
	(*t).Reset(d)
}
