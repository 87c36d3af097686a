package shaper

import (
	"context"
	"time"
)

type wireKey struct{}

// WithWire returns a context carrying fn, which a sink calls with the instant
// its request actually left for the downstream (for HTTP: when the request
// was written to the connection). The lane uses it to keep the spacing of
// SPEC G1 at the wire, not only at departure: when a request leaves late
// (the task goroutine or the connection's writer ran late), the next
// departure waits 0.99 interval from when it really left.
func WithWire(ctx context.Context, fn func(time.Time)) context.Context {
	return context.WithValue(ctx, wireKey{}, fn)
}

// WireFrom returns the function set by WithWire, or nil.
func WireFrom(ctx context.Context) func(time.Time) {
	fn, _ := ctx.Value(wireKey{}).(func(time.Time))
	return fn
}
