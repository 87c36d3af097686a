package drain

import (
	"context"
	"time"
)

// Waiter blocks a departure loop until the pacer's next departure time. The
// pacer's precision is only as good as its waiter: Go's timers wake up to about
// 1 ms late on these machines (NOTES.md), which at 100/s is a tenth of an
// interval. Use NewPreciseWaiter in production and TimerWaiter under
// testing/synctest (whose fake clock drives time.Timer but not the kernel).
type Waiter interface {
	// Bind prepares the calling goroutine; the departure loop calls it once,
	// before its first Wait, and Unbind when it stops.
	Bind()
	Unbind()
	// Wait returns when the clock reaches t (woke false, err nil), when wake
	// receives a token (woke true), or when ctx ends (ctx.Err()).
	Wait(ctx context.Context, t time.Time, wake <-chan struct{}) (woke bool, err error)
}

// TimerWaiter waits with a plain time.Timer. It is exact on the fake clock of
// testing/synctest and about 1 ms late on a real one.
type TimerWaiter struct{}

// Bind does nothing.
func (TimerWaiter) Bind() {}

// Unbind does nothing.
func (TimerWaiter) Unbind() {}

// Wait implements Waiter.
func (TimerWaiter) Wait(ctx context.Context, t time.Time, wake <-chan struct{}) (bool, error) {
	return timerWait(ctx, time.Until(t), wake)
}

func timerWait(ctx context.Context, d time.Duration, wake <-chan struct{}) (bool, error) {
	if d <= 0 {
		return false, ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return false, nil
	case <-wake:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}
