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
// receive timestamp of the last read.
type tsReader struct {
	raw interface {
		Read(func(fd uintptr) bool) error
	}
	last time.Time
	oob  []byte
}

func (r *tsReader) Read(p []byte) (int, error) {
	var n, oobn int
	var rerr error
	err := r.raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), p, r.oob, 0)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 {
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

// Last returns the kernel receive time of the last read.
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
