package shaper

import (
	"context"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// coarseMargin is how long before the deadline the precise waiter leaves the
// Go timer (cancellable, ~1 ms late when idle, several ms on a busy machine)
// for clock_nanosleep (not cancellable,
// ~20–30 µs late with a 1 µs timer slack, NOTES.md).
const coarseMargin = 5 * time.Millisecond

// maxEarly caps how early the precise waiter aims to absorb its wake-up
// latency; the rest of the way it spins.
const maxEarly = 100 * time.Microsecond

// PreciseWaiter sleeps until an absolute instant with microsecond precision:
// a Go timer until 5 ms before, then clock_nanosleep(CLOCK_MONOTONIC,
// TIMER_ABSTIME) on the loop's locked OS thread with its timer slack set to
// 1 µs, aimed early by the measured wake-up latency, and a short spin for the
// remainder. Measured here it costs tens of microseconds of CPU per wake-up.
// It must be used by one goroutine, between Bind and Unbind.
type PreciseWaiter struct {
	early time.Duration // moving estimate of clock_nanosleep's lateness
}

// NewPreciseWaiter returns a precise waiter (Linux).
func NewPreciseWaiter() Waiter { return &PreciseWaiter{early: 30 * time.Microsecond} }

// Bind locks the calling goroutine to its OS thread and sets that thread's
// timer slack to 1 µs (prctl PR_SET_TIMERSLACK; the default is 50 µs).
func (w *PreciseWaiter) Bind() {
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0) // best effort
}

// Unbind unlocks the OS thread. The thread keeps its small timer slack, which
// only makes its sleeps more exact.
func (w *PreciseWaiter) Unbind() { runtime.UnlockOSThread() }

// Wait implements Waiter.
func (w *PreciseWaiter) Wait(ctx context.Context, t time.Time, wake <-chan struct{}) (bool, error) {
	d := time.Until(t)
	if d > coarseMargin {
		if woke, err := timerWait(ctx, d-coarseMargin, wake); woke || err != nil {
			return woke, err
		}
		d = time.Until(t)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if d <= 0 {
		return false, nil
	}
	aim := t.Add(-w.early)
	if rem := time.Until(aim); rem > 0 {
		var ts unix.Timespec
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) == nil {
			mono := time.Duration(ts.Nano()) + rem
			req := unix.NsecToTimespec(int64(mono))
			for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &req, nil) == unix.EINTR {
			}
			late := -time.Until(aim)
			// Exponential moving average of the lateness, 1/8 weight.
			w.early += (min(max(late, 0), maxEarly) - w.early) / 8
		}
	}
	for time.Now().Before(t) {
		// Spin the last few microseconds; the budget is bounded by w.early.
	}
	return false, nil
}
