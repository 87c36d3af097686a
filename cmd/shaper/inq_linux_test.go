package main

import (
	"net"

	"golang.org/x/sys/unix"
)

// queuedBytes returns how many bytes wait in c's receive queue (SIOCINQ),
// or -1 when it cannot tell.
func queuedBytes(c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	if err := rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			n = v
		}
	}); err != nil {
		return -1
	}
	return n
}
