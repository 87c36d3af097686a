//go:build !linux

package kstamp

import (
	"net"
	"time"
)

// Listen is a plain listener where SO_TIMESTAMPNS is not used.
func Listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

type sys struct {
	c        net.Conn
	quickAck bool
}

func (s *sys) init(c *net.TCPConn) error { s.c = c; return nil }

func (s *sys) read(p []byte) (int, time.Time, error) {
	n, err := s.c.Read(p)
	return n, time.Time{}, err
}
