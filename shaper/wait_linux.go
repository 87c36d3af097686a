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
// Cancellation (ctx, wake) is immediate: it sets a read deadline in the past.
// A PreciseWaiter is used by one goroutine at a time.
type PreciseWaiter struct {
	once  sync.Once
	f     *os.File
	fd    int
	err   error
	early time.Duration // moving estimate of the wake-up latency
}

// NewPreciseWaiter returns a precise waiter (Linux). It falls back to a
// plain timer if a timerfd cannot be created.
func NewPreciseWaiter() Waiter { return &PreciseWaiter{early: 50 * time.Microsecond} }

// Bind creates the timerfd.
func (w *PreciseWaiter) Bind() {
	w.once.Do(func() {
		fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
		if err != nil {
			w.err = err
			return
		}
		w.fd = fd
		w.f = os.NewFile(uintptr(fd), "shaper-timerfd")
	})
}

// Unbind leaves the timerfd open for a later Bind of the same waiter; it is
// released with the process (one per lane).
func (w *PreciseWaiter) Unbind() {}

// Wait implements Waiter.
func (w *PreciseWaiter) Wait(ctx context.Context, t time.Time, wake <-chan struct{}) (bool, error) {
	w.Bind()
	if w.err != nil {
		return TimerWaiter{}.Wait(ctx, t, wake)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
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
		_ = w.f.SetReadDeadline(time.Time{})
		// Interrupt the read on cancellation or on a wake token.
		done := make(chan struct{})
		var woke bool
		var mu sync.Mutex
		interrupt := func(byWake bool) {
			mu.Lock()
			woke = woke || byWake
			mu.Unlock()
			_ = w.f.SetReadDeadline(time.Unix(1, 0))
		}
		stop := context.AfterFunc(ctx, func() { interrupt(false) })
		if wake != nil {
			go func() {
				select {
				case <-wake:
					interrupt(true)
				case <-done:
				}
			}()
		}
		var buf [8]byte
		_, rerr := w.f.Read(buf[:])
		close(done)
		stop()
		if rerr != nil && errors.Is(rerr, os.ErrDeadlineExceeded) {
			disarm := unix.ItimerSpec{}
			_ = unix.TimerfdSettime(w.fd, 0, &disarm, nil)
			mu.Lock()
			byWake := woke
			mu.Unlock()
			if err := ctx.Err(); err != nil {
				return false, err
			}
			return byWake, nil
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
