//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// listenTimestamped listens with SO_TIMESTAMPNS already on, so accepted
// connections inherit it and the first request of a fresh connection is
// stamped when it arrived, not when the server got round to it.
func listenTimestamped(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

// tsReader reads from a TCP connection with recvmsg, keeping the kernel
// receive timestamp of the first byte each read returns.
//
// Before each read it peeks at one byte (MSG_PEEK): TCP reports the stamp
// of the last segment a recvmsg consumed, so a read that drains several
// queued segments would report the newest of them, not the one its data
// starts with. The peek touches only the segment at the head of the queue,
// so a read that starts a request is stamped with the arrival of the
// segment carrying its request line, however late the reader got to it.
// Segments the kernel has merged in the queue keep the newest stamp (two
// writes 30 ms apart, read as one, were stamped at the second), so the
// stamp is exact for a request that arrives in one write into an empty
// queue: what an HTTP/1.1 client sends (Go's transport writes a request
// with an in-memory body in one Write, and the next one only after the
// response).
type tsReader struct {
	raw interface {
		Read(func(fd uintptr) bool) error
	}
	last time.Time
	oob  []byte
}

func (r *tsReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n, oobn int
	var rerr error
	var one [1]byte
	err := r.raw.Read(func(fd uintptr) bool {
		for {
			_, oobn, _, _, rerr = unix.Recvmsg(int(fd), one[:], r.oob, unix.MSG_PEEK)
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr == unix.EAGAIN {
			return false // nothing queued: wait for the poller
		}
		if rerr != nil {
			return true
		}
		// Something is queued (or the peer closed: the read returns 0), so
		// this read does not block.
		for {
			n, rerr = unix.Read(int(fd), p)
			if rerr != unix.EINTR {
				break
			}
		}
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n <= 0 {
		return 0, io.EOF
	}
	r.last = time.Now()
	if msgs, err := unix.ParseSocketControlMessage(r.oob[:oobn]); err == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
				sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
				nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
				r.last = time.Unix(sec, nsec)
			}
		}
	}
	return n, nil
}

// Last returns the kernel receive time of the first byte of the last read.
func (r *tsReader) Last() time.Time { return r.last }

func newStampedReader(c *net.TCPConn) (stampedReader, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	})
	return &tsReader{raw: raw, oob: make([]byte, 128)}, nil
}
