package sinks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/shaper"
)

// NATS publishes each message to a JetStream subject: the sink of SPEC §4
// kind nats, for lanes that feed another stream at a paced rate.
//
// The published message has the job's payload and headers, minus the
// headers whose name starts with "Nats-" (case-insensitive): those are
// JetStream's instructions to the original stream (Nats-Expected-Stream,
// Nats-Rollup, Nats-TTL, …) and would change or break the publish to the
// target. Nats-Msg-Id is then set to Message.Key() (SPEC G8), so the
// target stream drops a redelivered job as a duplicate within its
// duplicate window (StreamConfig.Duplicates, 2 minutes by default); a
// duplicate counts as delivered.
//
// Send waits for the JetStream publish acknowledgement. A publish error is
// retryable (no stream for the subject, no responders, a timeout, a lost
// connection, a JetStream API error), except a payload larger than the
// server's max_payload, which no retry can fix and is permanent. NATS is
// safe for concurrent use.
//
// # The wire
//
// SPEC G1 holds for what reaches the server, so each publish must leave
// when its task makes it, not when the client library gets round to it. A
// nats.Conn does not write a publish: Conn.publish appends it to the
// connection's write buffer and kicks the flusher goroutine (kickFlusher, a
// non-blocking send on a channel), which writes whatever has accumulated
// whenever the scheduler runs it — late, on a loaded machine, and then many
// publishes in one segment (NOTES.md). The buffer writes in place, in the
// publishing goroutine, only once it holds Options.WriteBufferSize bytes
// (natsWriter.appendBufs: len(w.bufs) >= w.limit → w.flush()); the only
// other in-place write is that of a PING (Conn.Flush*, sendPing), which
// would cost a PING and a PONG per message.
//
// So the sink publishes on a connection of its own, dialed at the first
// Send with the options of js's connection (servers, credentials, TLS,
// dialer, reconnect policy, error handler — not its connection-state
// callbacks) and a write buffer of one byte: every publish is written to
// the socket by the Send that makes it, in one write, with no extra
// protocol. Acknowledgements arrive on that connection too. The sink also
// reports each write to the lane (ReportsWire), which, up to 1,000/s, holds
// the next departure until the previous publish is on the wire
// (drain.WireReporter). Above that the lane does not wait, and with many
// publishes under way at once their writes take turns on the connection's
// lock, which each holds for its write: after a stall of the process they
// leave one write each, but close together. Until the connection is up —
// while the first dial is in progress, and for redialInterval after one
// failed — Sends publish through js as before; a connection that ends up
// closed is replaced the same way.
type NATS struct {
	js      jetstream.JetStream
	subject string
	gate    gate

	mu      sync.Mutex
	own     *ownConn // nil until dialed
	dialing bool
	retryAt time.Time // no dial before this after a failed one
}

// ownConn is the sink's own connection (see [NATS]).
type ownConn struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	wire *natsWire
}

// redialInterval is how long after a failed dial of its own connection the
// sink publishes through the caller's connection before it tries again.
const redialInterval = time.Second

// NewNATS returns a sink publishing to subject through js. The caller owns
// js and its connection: Close leaves them open. The sink dials a
// connection of its own with the same options at the first Send (see
// [NATS]) and closes that one on Close.
func NewNATS(js jetstream.JetStream, subject string) *NATS {
	return &NATS{js: js, subject: subject}
}

// ReportsWire reports true: Send calls the function of shaper.WithWire when
// its publish has been written to the socket (drain.WireReporter).
func (s *NATS) ReportsWire() bool { return true }

// ReadsPackedHeaders implements drain.PackedHeaderReader: the sink reads
// a message's headers through its accessors only.
func (s *NATS) ReadsPackedHeaders() bool { return true }

// Send publishes m and waits for the acknowledgement or the end of ctx. It
// returns nil once the target stream stored the message (or reported it a
// duplicate), otherwise a *shaper.SinkError with Status 0.
func (s *NATS) Send(ctx context.Context, m *shaper.Message) error {
	what := fmt.Sprintf("nats publish to %q", s.subject)
	if !s.gate.enter() {
		return retryable(what, ErrClosed)
	}
	defer s.gate.leave()
	if err := ctx.Err(); err != nil {
		return retryable(what, err)
	}
	h := make(nats.Header, 2)
	for name, v := range m.HeaderPairs() { // packed or not (ReadsPackedHeaders)
		if hasPrefixFold(name, "Nats-") {
			continue
		}
		h[name] = append(h[name], v)
	}
	h.Set(jetstream.MsgIDHeader, m.Key())
	own := s.publisher(ctx)
	js := s.js
	if own != nil {
		js = own.js
	}
	if wire := shaper.WireFrom(ctx); wire != nil {
		if own != nil {
			w := &wire
			own.wire.expect(w)
			defer func() {
				if own.wire.forget(w) { // no write came (an error before it, a reconnect's buffer)
					wire(time.Now(), false)
				}
			}()
		} else {
			// Through the caller's connection its flusher writes the
			// publish at a time no one reports; now is the best guess.
			wire(time.Now(), false)
		}
	}
	_, err := js.PublishMsg(ctx, &nats.Msg{Subject: s.subject, Header: h, Data: m.Data})
	if err == nil {
		return nil
	}
	if own != nil && errors.Is(err, nats.ErrConnectionClosed) {
		s.drop(own) // its reconnects gave up: the next Send dials again
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w (%v)", ctxErr, err)
	}
	return &shaper.SinkError{
		Permanent: errors.Is(err, nats.ErrMaxPayload),
		Err:       fmt.Errorf("%s: %w", what, err),
	}
}

// publisher returns the sink's own connection, dialing it first if there is
// none, or nil when Send publishes through the caller's js (see [NATS]).
func (s *NATS) publisher(ctx context.Context) *ownConn {
	s.mu.Lock()
	if s.own != nil || s.dialing || time.Now().Before(s.retryAt) {
		own := s.own
		s.mu.Unlock()
		return own
	}
	s.dialing = true
	s.mu.Unlock()

	own, err := dialOwn(ctx, s.js.Conn())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dialing = false
	if err != nil {
		s.retryAt = time.Now().Add(redialInterval)
		return nil
	}
	s.own = own
	return own
}

// drop forgets own, a connection that closed for good, and closes it.
func (s *NATS) drop(own *ownConn) {
	s.mu.Lock()
	if s.own == own {
		s.own = nil
	}
	s.mu.Unlock()
	own.nc.Close()
}

// dialOwn connects with base's options and a one-byte write buffer, so that
// every publish is written to the socket by the goroutine that makes it
// (see [NATS]), through sockets that report their writes. The dial is
// bounded by ctx's deadline.
func dialOwn(ctx context.Context, base *nats.Conn) (*ownConn, error) {
	if base == nil {
		return nil, errors.New("no connection")
	}
	o := base.Opts // a copy; nats.go writes it only in Connect and the Set…Handler calls
	o.WriteBufferSize = 1
	// The connection-state callbacks are the caller's, written for its
	// connection (a ClosedCB may close a channel); this one's state shows
	// in Send's errors.
	o.ClosedCB, o.DisconnectedCB, o.DisconnectedErrCB, o.ConnectedCB = nil, nil, nil, nil
	o.ReconnectedCB, o.ReconnectErrCB, o.DiscoveredServersCB, o.LameDuckModeHandler = nil, nil, nil, nil
	o.RetryOnFailedConnect = false // fail now: Send falls back meanwhile
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return nil, context.DeadlineExceeded
		}
		if o.Timeout <= 0 || left < o.Timeout {
			o.Timeout = left
		}
		if o.Dialer != nil {
			d := *o.Dialer
			d.Timeout = o.Timeout
			o.Dialer = &d
		}
	}
	w := &natsWire{}
	w.wrapDialing(&o)
	nc, err := o.Connect()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &ownConn{nc: nc, js: js, wire: w}, nil
}

// Close waits for Sends in progress and closes the sink's own connection.
// It does not close js or its connection. It always returns nil; later
// calls return at once.
func (s *NATS) Close() error {
	if !s.gate.close() {
		return nil
	}
	s.mu.Lock()
	own := s.own
	s.own = nil
	s.mu.Unlock()
	if own != nil {
		own.nc.Close()
	}
	return nil
}

// natsWire reports when the sink's own connection writes a publish
// (shaper.WithWire). Each Send queues its report just before it publishes;
// each write to the socket calls the oldest report queued. A publish is one
// write, made by the Send itself (a one-byte write buffer, see [NATS]), so
// when one publish is under way at a time — the lane's wait for the wire
// makes it so — its report is called by its own write (or, on the first
// publish, by the reply subscription written just before it). With several
// under way at once a report may be called by another's write, never lost;
// a Send whose publish wrote nothing takes its report back (forget).
type natsWire struct {
	mu      sync.Mutex
	pending []*func(time.Time, bool) // oldest first
}

// expect queues fn, to be called at the next write with no older report.
func (w *natsWire) expect(fn *func(time.Time, bool)) {
	w.mu.Lock()
	w.pending = append(w.pending, fn)
	w.mu.Unlock()
}

// forget takes fn back; it reports whether fn was still queued.
func (w *natsWire) forget(fn *func(time.Time, bool)) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := slices.Index(w.pending, fn); i >= 0 {
		w.pending = slices.Delete(w.pending, i, i+1)
		return true
	}
	return false
}

// wrote calls the oldest report queued, with at.
func (w *natsWire) wrote(at time.Time) {
	w.mu.Lock()
	if len(w.pending) == 0 {
		w.mu.Unlock()
		return
	}
	fn := w.pending[0]
	w.pending[0] = nil
	w.pending = w.pending[1:]
	w.mu.Unlock()
	// Not exact (shaper.WithWire): with several publishes under way the
	// write may be another's.
	(*fn)(at, false)
}

// wrapDialing makes the connections of o (one at a time, dialled again on
// reconnect) report their writes to w, whichever way o connects: an
// in-process server, a custom dialer, or a *net.Dialer.
func (w *natsWire) wrapDialing(o *nats.Options) {
	if o.InProcessServer != nil {
		o.InProcessServer = natsWireInProcess{o.InProcessServer, w}
		return
	}
	if o.CustomDialer != nil {
		if sd, ok := o.CustomDialer.(interface{ SkipTLSHandshake() bool }); ok {
			o.CustomDialer = natsWireSkipTLSDialer{natsWireDialer{o.CustomDialer, w}, sd}
		} else {
			o.CustomDialer = natsWireDialer{o.CustomDialer, w}
		}
		return
	}
	d := net.Dialer{Timeout: o.Timeout}
	if o.Dialer != nil {
		d = *o.Dialer
	}
	if o.AllowMultipathTCP != nil {
		d.SetMultipathTCP(*o.AllowMultipathTCP)
	}
	o.CustomDialer = natsWireDialer{&d, w}
}

type natsWireDialer struct {
	d interface {
		Dial(network, address string) (net.Conn, error)
	}
	w *natsWire
}

func (d natsWireDialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.d.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &natsWireConn{Conn: c, w: d.w}, nil
}

type natsWireSkipTLSDialer struct {
	natsWireDialer
	sd interface{ SkipTLSHandshake() bool }
}

func (d natsWireSkipTLSDialer) SkipTLSHandshake() bool { return d.sd.SkipTLSHandshake() }

type natsWireInProcess struct {
	p nats.InProcessConnProvider
	w *natsWire
}

func (p natsWireInProcess) InProcessConn() (net.Conn, error) {
	c, err := p.p.InProcessConn()
	if err != nil {
		return nil, err
	}
	return &natsWireConn{Conn: c, w: p.w}, nil
}

// natsWireConn calls the oldest queued report of its natsWire when a Write
// that wrote something returned.
type natsWireConn struct {
	net.Conn
	w *natsWire
}

func (c *natsWireConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.w.wrote(time.Now())
	}
	return n, err
}
