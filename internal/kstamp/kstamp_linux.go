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
// arrived, not when the server got round to it. It returns once the kernel
// stamps what arrives (awaitStamping).
func Listen(addr string) (net.Listener, error) {
	ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	awaitStamping()
	return ln, nil
}

func listen(addr string) (net.Listener, error) {
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

// stampingWait bounds awaitStamping.
const stampingWait = 2 * time.Second

// awaitStamping waits, up to stampingWait, until the kernel stamps the
// segments a TCP socket with SO_TIMESTAMPNS receives, and reports whether
// it does. The kernel stamps received packets only while some socket of
// the system asks for it, and it turns that on in a deferred work item
// when the first such socket appears (net_enable_timestamp), so data that
// arrives at once may carry no stamp: on this VM, 9 of 20 fresh listeners
// (no other stamping socket open) read their first data unstamped, and a
// CI run's stamp fell back to the read, 100 ms after the arrival
// (TestStampedReaderLateRead). The caller's own socket keeps stamping on
// once it is: the probe's loopback pair is closed on return.
func awaitStamping() bool {
	ln, err := listen("127.0.0.1:0")
	if err != nil {
		return false
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return false
	}
	defer c.Close()
	a, err := ln.Accept()
	if err != nil {
		return false
	}
	defer a.Close()
	var s sys // a has SO_TIMESTAMPNS from ln: enable sets up the reads
	if err := s.enable(a.(*net.TCPConn)); err != nil {
		return false
	}
	buf := make([]byte, 8)
	for deadline := time.Now().Add(stampingWait); ; {
		if _, err := c.Write([]byte{0}); err != nil {
			return false
		}
		if _, stamp, err := s.read(buf); err != nil {
			return false
		} else if !stamp.IsZero() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

type sys struct {
	raw      syscall.RawConn
	oob      []byte
	quickAck bool
	was      bool // SO_TIMESTAMPNS was on already (accepted from Listen)
}

// init switches SO_TIMESTAMPNS on for c. A connection that did not have it
// (not accepted from Listen) then waits until the kernel stamps
// (awaitStamping).
func (s *sys) init(c *net.TCPConn) error {
	if err := s.enable(c); err != nil {
		return err
	}
	if !s.was {
		awaitStamping()
	}
	return nil
}

// enable switches SO_TIMESTAMPNS on for c; was reports whether it was on.
func (s *sys) enable(c *net.TCPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		on, gerr := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS)
		s.was = gerr == nil && on != 0
		serr = enable(fd)
	}); err != nil {
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
