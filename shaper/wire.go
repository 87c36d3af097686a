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

// Gate is what a lane hands a sink that gates its writes (drain.WireGater),
// through WithGate.
type Gate interface {
	// Wait is called just before the first byte of each attempt to write
	// the request (a retry on a fresh connection calls it again), and
	// returns at the request's departure instant. The lane released the
	// task up to a lead earlier, so that the request waits here instead of
	// on its way to the connection (drain/gate.go); the downstream then
	// sees it no earlier than the departure, which SPEC G1's proofs count
	// from (Pacer.Wire, the tiles). A request whose write was held so long
	// that later requests left before it (overtaken) waits here for a
	// departure of its own. Wait returns early when the task's context
	// ends; the sink must then not write.
	Wait()
	// Yield tells the lane the request will not be written at its
	// departure (it waits for a credential, or it is about to be sent a
	// second time): the next departures do not wait for its write, and its
	// next Wait waits for a departure of its own (SPEC G5, and G1 at the
	// downstream).
	Yield()
	// Early reports whether the task was released before its departure
	// instant (above 1,000/s), so that its request waits at Wait for up to
	// the lane's lead: a sink may then take another way to the wire
	// (sinks/direct.go).
	Early() bool
}

// GateFunc is a Gate whose Wait calls the function, whose Yield does
// nothing and which is Early (tests, and sinks' own tests of their gate).
type GateFunc func()

// Wait calls f.
func (f GateFunc) Wait() { f() }

// Yield does nothing.
func (f GateFunc) Yield() {}

// Early reports true.
func (f GateFunc) Early() bool { return true }

// WithGate returns a context carrying g for a sink that gates its writes.
func WithGate(ctx context.Context, g Gate) context.Context {
	return context.WithValue(ctx, gateKey{}, g)
}

// GateFrom returns the Gate set by WithGate, or nil.
func GateFrom(ctx context.Context) Gate {
	g, _ := ctx.Value(gateKey{}).(Gate)
	return g
}
