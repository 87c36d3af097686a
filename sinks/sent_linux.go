//go:build linux

package sinks

import (
	"context"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sentProbe reads how many bytes written to one connection are not yet
// sent (SIOCOUTQNSD). Made once per connection (newSentProbe), so that a
// look allocates nothing; used by the one goroutine writing to it.
type sentProbe struct {
	rc     syscall.RawConn
	unsent int
	look   func(fd uintptr)
}

// newSentProbe returns the probe of c, or nil when c has no descriptor.
func newSentProbe(c net.Conn) *sentProbe {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p := &sentProbe{rc: rc}
	p.look = func(fd uintptr) {
		n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQNSD)
		if err != nil {
			n = 0
		}
		p.unsent = n
	}
	return p
}

// awaitSent returns once the first of the last n bytes written to the
// probe's connection has left its send queue (the bytes not yet sent are
// fewer than n: the queue is first in, first out), when ctx ends, or after
// maxUnsentWait; at once, with one ioctl, in the usual case. A nil probe
// returns at once.
//
// Why: a request is reported on the wire when its write returned
// (shaper.WithWire), and up to 1,000/s the next request's first byte waits
// for that report + min_spacing intervals (drain/gate.go). A write returns
// once the bytes are in the send queue, not when they left: a downstream
// that answers before it has read a request's body (HTTP/1.1 allows it)
// and reads the rest slowly keeps the connection's receive window shut,
// and the next request on that connection sat behind the body's tail,
// then arrived next to the request after it: 31–32 of 299 gaps under the
// floor at 200/s, the closest 1–6 µs, with the body read 5 ms after the
// answer (159 of 299, the closest 332 ns, at 10 ms;
// TestHTTPSpacingWithEarlyAnswers; a new user's run, session 34, found
// it). Reported once its first byte has left, a request is stamped by its
// report, and the spacing counts from there; the rest of its body follows
// as the downstream reads. The cost is the downstream's: such a lane waits
// for it (178/s at 200/s with reads 5 ms late, 103/s at 10 ms, under
// cause="wire"). It holds while the downstream takes a request's first
// byte within maxWireWait: after that the lane departs the next request
// without the report (G5).
func (p *sentProbe) awaitSent(ctx context.Context, n int) {
	if p == nil || p.sent(n) {
		return
	}
	deadline := time.Now().Add(maxUnsentWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(unsentPoll)
		if p.sent(n) {
			return
		}
	}
}

// sent reports whether the first of the last n bytes written has left the
// send queue (or the queue cannot be read).
func (p *sentProbe) sent(n int) bool {
	return p.rc.Control(p.look) != nil || p.unsent < n
}

// maxUnsentWait bounds awaitSent: the lane departs the next request after
// 50 ms without a report anyway (G5), and overtakes this one.
const maxUnsentWait = 50 * time.Millisecond

// unsentPoll is how often awaitSent looks again: a shut window opens when
// the downstream reads, so the wait is the downstream's, not a timer's.
const unsentPoll = 100 * time.Microsecond
