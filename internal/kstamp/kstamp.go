// Package kstamp stamps what a TCP server receives with the kernel's receive
// time (SO_TIMESTAMPNS), for the demo's rigid downstream and the tests that
// judge rate windows where the downstream counts them (NOTES.md: handler
// timestamps on these loaded cores turned exact streams into fake bursts).
//
// A Reader peeks one byte (MSG_PEEK) before each read: TCP reports the stamp
// of the last segment a recvmsg consumed, so a read that drains several
// queued segments would report the newest of them; the peek touches only the
// segment at the head of the queue, so a read is stamped with the arrival of
// the segment its data starts with, however late the reader got to it.
// Segments the kernel has merged in the queue keep the newest stamp (two
// writes 30 ms apart, read as one, were stamped at the second), so the stamp
// is exact for data that arrives in one write into an empty queue — what an
// HTTP/1.1 client sends (Go's transport writes a request with an in-memory
// body in one Write, and the next one only after the response).
//
// Off Linux, Listen is a plain listener and a Reader stamps with time.Now
// when the read returns (Kernel reports false).
package kstamp

import (
	"net"
	"time"
)

// Reader reads a TCP connection and tells when the data of the last read
// arrived. It is used by one goroutine at a time.
type Reader struct {
	sys
	last   time.Time
	kernel bool
}

// Option configures a Reader.
type Option func(*Reader)

// QuickAck makes the Reader acknowledge each segment at once (TCP_QUICKACK
// after every read): a delayed ACK holds the sender's congestion window
// shut, and its kernel then sends what queued meanwhile as one segment — a
// clump the reader would have made, not the sender. For proxies.
func QuickAck() Option { return func(r *Reader) { r.quickAck = true } }

// NewReader returns a Reader of c, switching SO_TIMESTAMPNS on for it (a
// connection accepted from Listen has it already, from its first segment).
func NewReader(c *net.TCPConn, opts ...Option) (*Reader, error) {
	r := &Reader{}
	for _, o := range opts {
		o(r)
	}
	if err := r.init(c); err != nil {
		return nil, err
	}
	return r, nil
}

// Read reads into p (an io.Reader); Last then tells when that data arrived.
func (r *Reader) Read(p []byte) (int, error) {
	n, stamp, err := r.read(p)
	if err != nil {
		return 0, err
	}
	r.kernel = !stamp.IsZero()
	if r.kernel {
		r.last = stamp
	} else {
		r.last = time.Now()
	}
	return n, nil
}

// Last returns the kernel receive time of the first byte of the last read,
// or when the read returned if the kernel gave no stamp (see Kernel).
func (r *Reader) Last() time.Time { return r.last }

// Kernel reports whether the last read was stamped by the kernel.
func (r *Reader) Kernel() bool { return r.kernel }
