//go:build !linux

package shaper

// NewPreciseWaiter returns a TimerWaiter where clock_nanosleep is not used.
func NewPreciseWaiter() Waiter { return TimerWaiter{} }
