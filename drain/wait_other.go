//go:build !linux

package drain

// NewPreciseWaiter returns a TimerWaiter where timerfd is not available
// (it is Linux-only): about 1 ms late per wake-up.
func NewPreciseWaiter() Waiter { return TimerWaiter{} }
