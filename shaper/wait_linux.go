package shaper

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// maxEarly caps how early the precise waiter aims to absorb its wake-up
// latency; the rest of the way it spins.
const maxEarly = 200 * time.Microsecond

// PreciseWaiter sleeps until an absolute instant with microsecond precision
// without holding a scheduler slot (P) while it sleeps. It arms a timerfd
// (CLOCK_MONOTONIC, TFD_TIMER_ABSTIME; hrtimer precision, no timer slack)
// and reads it through Go's network poller, so the goroutine is parked like
// any socket reader; it aims early by a moving estimate of the wake-up
// latency and spins the remaining microseconds.
//
// Measured here (NOTES.md): Go's own timers wake up to ~1 ms late when idle
// (epoll_wait has a millisecond timeout) and several ms on a busy machine;
// clock_nanosleep is exact but blocks an OS thread *and* its P while in the
// syscall — with 2 cores that starves the sink's HTTP goroutines for
// milliseconds. A timerfd in the poller has neither problem.
//
// Cancellation is immediate: ctx (through context.AfterFunc) and a token on
// the wake channel (through one watcher goroutine per waiter, started with
// the first Wait and stopped by Unbind — not one goroutine per wait, which
// cost the departure loop an allocation and a goroutine per departure) set a
// read deadline in the past. A wake token that arrives between waits makes
// the next Wait return at once, as a buffered channel would.
// A PreciseWaiter is used by one goroutine at a time, between Bind and Unbind.
type PreciseWaiter struct {
	f     *os.File
	fd    int
	err   error
	early time.Duration // moving estimate of the wake-up latency

	watched   <-chan struct{} // the wake channel the watcher reads
	stopWatch chan struct{}
	watchDone chan struct{}

	mu      sync.Mutex
	waiting bool // a Read of the timerfd is in progress
	woke    bool // the watcher interrupted that Read
	pending bool // a wake token arrived between waits
}

// NewPreciseWaiter returns a precise waiter (Linux). It falls back to a
// plain timer if a timerfd cannot be created.
func NewPreciseWaiter() Waiter { return &PreciseWaiter{early: 50 * time.Microsecond} }

// Bind creates the timerfd.
func (w *PreciseWaiter) Bind() {
	if w.f != nil || w.err != nil {
		return
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		w.err = err
		return
	}
	w.fd = fd
	w.f = os.NewFile(uintptr(fd), "shaper-timerfd")
}

// Unbind stops the wake watcher and closes the timerfd; a later Bind makes
// a new one.
func (w *PreciseWaiter) Unbind() {
	if w.stopWatch != nil {
		close(w.stopWatch)
		<-w.watchDone
		w.stopWatch, w.watched = nil, nil
	}
	if w.f != nil {
		_ = w.f.Close()
		w.f = nil
	}
}

// watch starts the goroutine that turns tokens on wake into interrupts.
func (w *PreciseWaiter) watch(wake <-chan struct{}) {
	if wake == nil || wake == w.watched {
		return
	}
	if w.stopWatch != nil {
		close(w.stopWatch)
		<-w.watchDone
	}
	w.watched, w.stopWatch, w.watchDone = wake, make(chan struct{}), make(chan struct{})
	stop, done, f := w.stopWatch, w.watchDone, w.f
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-wake:
				w.mu.Lock()
				if w.waiting {
					w.woke = true
					_ = f.SetReadDeadline(time.Unix(1, 0))
				} else {
					w.pending = true
				}
				w.mu.Unlock()
			}
		}
	}()
}

// Wait implements Waiter.
func (w *PreciseWaiter) Wait(ctx context.Context, t time.Time, wake <-chan struct{}) (bool, error) {
	w.Bind()
	if w.err != nil {
		return TimerWaiter{}.Wait(ctx, t, wake)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	w.watch(wake)
	w.mu.Lock()
	if w.pending {
		w.pending = false
		w.mu.Unlock()
		return true, nil
	}
	w.mu.Unlock()
	aim := t.Add(-w.early)
	if rem := time.Until(aim); rem > 0 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			return TimerWaiter{}.Wait(ctx, t, wake)
		}
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(ts.Nano() + int64(rem))}
		if err := unix.TimerfdSettime(w.fd, unix.TFD_TIMER_ABSTIME, &spec, nil); err != nil {
			return TimerWaiter{}.Wait(ctx, t, wake)
		}
		w.mu.Lock()
		_ = w.f.SetReadDeadline(time.Time{})
		w.waiting, w.woke = true, false
		w.mu.Unlock()
		stop := context.AfterFunc(ctx, func() {
			w.mu.Lock()
			if w.waiting {
				_ = w.f.SetReadDeadline(time.Unix(1, 0))
			}
			w.mu.Unlock()
		})
		var buf [8]byte
		_, rerr := w.f.Read(buf[:])
		stop()
		w.mu.Lock()
		w.waiting = false
		byWake := w.woke
		w.mu.Unlock()
		if rerr != nil && errors.Is(rerr, os.ErrDeadlineExceeded) {
			disarm := unix.ItimerSpec{}
			_ = unix.TimerfdSettime(w.fd, 0, &disarm, nil)
			if err := ctx.Err(); err != nil {
				return false, err
			}
			return byWake, nil
		}
		if byWake {
			return true, nil // interrupted just as the timer fired: re-read Next
		}
		late := -time.Until(aim)
		// Exponential moving average of the wake-up latency, 1/8 weight.
		w.early += (min(max(late, 0), maxEarly) - w.early) / 8
	}
	for time.Now().Before(t) {
		// Spin the last microseconds; bounded by the estimate above.
	}
	return false, nil
}
