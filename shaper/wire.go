package shaper

import (
	"context"
	"time"
)

type wireKey struct{}

// WithWire returns a context carrying fn, which a sink calls with the instant
// at which its request actually left for the downstream (for HTTP: when the
// request was written to the connection). The lane uses it to keep SPEC G1
// at the wire, not only at departure: when a request leaves late (the task
// goroutine or the connection's writer ran late), the schedule moves
// (Pacer.Wire).
//
// exact says that the downstream cannot have stamped the request's arrival
// after at: the request was written whole to a connection to this host's
// loopback, one request at a time (the HTTP sink's HTTP/1.1 connections). Above
// 1,000/s an exact report lets the schedule keep a whole interval of lag
// (Pacer.Wire, the tiles); a report that may come before the request's own
// write (HTTP/2, a caller's client, NATS with several publishes under way) or
// before a network's jitter keeps a tenth of an interval back for it.
func WithWire(ctx context.Context, fn func(at time.Time, exact bool)) context.Context {
	return context.WithValue(ctx, wireKey{}, fn)
}

// WireFrom returns the function set by WithWire, or nil.
func WireFrom(ctx context.Context) func(at time.Time, exact bool) {
	fn, _ := ctx.Value(wireKey{}).(func(time.Time, bool))
	return fn
}

type gateKey struct{}

// WithGate returns a context carrying fn, which a sink that gates its
// writes (drain.WireGater) calls once per request, just before the first
// byte of the request is written, and which returns at the request's
// departure instant. The lane released the task up to a lead earlier, so
// that the request waits at the gate instead of on its way to the
// connection (drain/gate.go); the downstream then sees it no earlier than
// the departure, which SPEC G1's proofs count from (Pacer.Wire, the tiles).
func WithGate(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, gateKey{}, fn)
}

// GateFrom returns the function set by WithGate, or nil.
func GateFrom(ctx context.Context) func() {
	fn, _ := ctx.Value(gateKey{}).(func())
	return fn
}
