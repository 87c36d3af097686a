package drain

import (
	"context"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Source feeds one lane. Implementations: sources.JetStream.
//
// Contract: Fetch asks the upstream for at most max messages and calls
// deliver for each one, in upstream order, as it arrives, from the calling
// goroutine; it returns when max messages arrived or when its own request
// expires (a few seconds at most), with a non-nil error when the request
// failed. Every message received from the upstream is passed to deliver —
// none is dropped, also when ctx ends (ctx only stops the wait for more).
// Fetch is called by one goroutine at a time.
type Source interface {
	Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error
}

// Sink delivers one message to the downstream. Implementations: the sinks
// package. Send is called concurrently by up to max_in_flight tasks; it must
// return when ctx ends (the task timeout). nil means delivered. A failure
// is a *shaper.SinkError when the sink knows more (status, Retry-After);
// errors.Is(err, shaper.ErrPermanent) marks a failure no retry can fix;
// anything else is retryable.
type Sink interface {
	Send(ctx context.Context, m *shaper.Message) error
}

// PackedHeaderReader is implemented by sinks that read a message's headers
// only through shaper.Message's accessors (HeaderValue, HeaderFirst,
// HeaderValues, HeaderPairs, HeaderMap, Key), never its Header field. For
// them the lane leaves the headers packed as the source kept them, instead
// of building the map of every message at departure (issue 15: ~3
// allocations per message). Every other sink sees Header set, as the
// Message's doc says. The sinks package's HTTP, NATS and Log sinks read
// them so.
type PackedHeaderReader interface {
	ReadsPackedHeaders() bool
}

// WireReporter is implemented by sinks that call the function of
// shaper.WithWire when a request leaves for the downstream. For them a
// departure waits until the previous request is on the wire, so that
// requests reach the downstream in order and spaced as they departed (SPEC
// G1: the bounds hold for what reaches the downstream) — at every rate:
// above 1,000/s, task goroutines that start late would otherwise reach the
// wire in clumps (measured with the nats sink at 10,000/s: 28–54 in 1 ms
// for a bound of 11 without the hold, 12 with it). It waits for at most
// maxWireWait (or an interval, if longer), so that a request stuck in the
// client (a dial that hangs) does not hold the lane for long (G5). Only the
// write of a request can hold the next departure, never the wait for its
// response. The cost is rate when the write path is slower than an
// interval: then the wire, not the pacer, sets the pace.
type WireReporter interface {
	ReportsWire() bool
}

// WireGater is implemented by WireReporters that call the Wait of the
// shaper.Gate of shaper.WithGate before the first byte of each attempt to
// write a request, on every path a request can take (sinks.HTTP with its
// own transport: in the connection's Write for HTTP/1.1, when the
// connection is got for HTTP/2), write nothing once the task's context
// ended, and Yield when a request will not be written at its departure (a
// wait for a credential). GatesWire reports whether this sink does. For
// them the lane releases a departure up to a lead before its instant above
// 1,000/s, the request waits at the gate, and a request overtaken by later
// departures waits there for a departure of its own (drain/gate.go). A sink
// that says true and writes before the gate returns lets the downstream see
// a request early, or among later ones: SPEC G1's windows at the downstream
// no longer hold.
type WireGater interface {
	GatesWire() bool
}

// maxWireWait bounds how long a departure waits for the previous request to
// reach the wire (WireReporter). The first request on a new connection pays
// the dial (measured up to ~15 ms on loopback here).
const maxWireWait = 50 * time.Millisecond

// Connector is implemented by sources that can tell whether they are
// connected to their server (sources.JetStream).
type Connector interface{ Connected() bool }

// Dedup remembers the keys (SPEC G8) of delivered messages for a window
// (sink.dedup_window; SPEC §3 Delivered-key dedup). Implementations:
// sources.KVDedup (a JetStream key-value bucket shared by all replicas of a
// lane, surviving restarts). Both methods are called concurrently by up to
// max_in_flight tasks and must return when ctx ends.
type Dedup interface {
	// Seen reports whether key was recorded within the window. An error
	// means the store could not tell; the lane then delivers the message
	// (at-least-once).
	Seen(ctx context.Context, key string) (bool, error)
	// Record stores key as delivered now, for the window. An error means
	// it may not be stored; the lane acks the message anyway.
	Record(ctx context.Context, key string) error
}
