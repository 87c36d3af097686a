//go:build unix

package sinks

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// alive reports whether the server has not closed c while it was idle: a
// peek that would block (nothing to read, no end of stream) says so; the
// end of stream, an error, or bytes nobody asked for say not. Servers that
// close idle connections (a keep-alive timeout) send their FIN first, so a
// request is not written into a connection already closed. A read with a
// deadline in the past would not do: Go's poller fails it before asking
// the kernel.
func (c *directConn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	live := false
	var one [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		_, _, err := unix.Recvfrom(int(fd), one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		live = err == unix.EAGAIN || err == unix.EWOULDBLOCK
		return true // never wait in the poller
	}); err != nil {
		return false
	}
	return live
}
