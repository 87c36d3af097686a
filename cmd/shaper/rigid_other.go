//go:build !linux

package main

import (
	"net"
	"time"
)

// listenTimestamped is a plain listener where SO_TIMESTAMPNS is not used:
// arrivals are stamped when read.
func listenTimestamped(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

type plainReader struct {
	c    net.Conn
	last time.Time
}

func (r *plainReader) Read(p []byte) (int, error) {
	n, err := r.c.Read(p)
	r.last = time.Now()
	return n, err
}

func (r *plainReader) Last() time.Time { return r.last }

func newStampedReader(c *net.TCPConn) (stampedReader, error) { return &plainReader{c: c}, nil }
