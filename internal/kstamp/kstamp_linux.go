//go:build linux

package kstamp

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listen listens on addr with SO_TIMESTAMPNS on, so accepted connections
// inherit it and the first data of a fresh connection is stamped when it
// arrived, not when the server got round to it.
func Listen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = enable(fd) }); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

func enable(fd uintptr) error {
	return unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
}

type sys struct {
	raw      syscall.RawConn
	oob      []byte
	quickAck bool
}

func (s *sys) init(c *net.TCPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = enable(fd) }); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	s.raw, s.oob = raw, make([]byte, unix.CmsgSpace(16)*2)
	return nil
}

// read peeks one byte to get the stamp of the head segment, then reads into
// p; the stamp is zero when the kernel gave none.
func (s *sys) read(p []byte) (int, time.Time, error) {
	if len(p) == 0 {
		return 0, time.Time{}, nil
	}
	var n, oobn int
	var rerr error
	var one [1]byte
	err := s.raw.Read(func(fd uintptr) bool {
		for {
			_, oobn, _, _, rerr = unix.Recvmsg(int(fd), one[:], s.oob, unix.MSG_PEEK)
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
		if s.quickAck { // does not stick: set again after each read
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1)
		}
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, time.Time{}, err
	}
	if n <= 0 {
		return 0, time.Time{}, io.EOF
	}
	var stamp time.Time
	if msgs, perr := unix.ParseSocketControlMessage(s.oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
				sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
				nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
				stamp = time.Unix(sec, nsec)
			}
		}
	}
	return n, stamp, nil
}
