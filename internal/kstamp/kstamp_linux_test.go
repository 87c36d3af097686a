//go:build linux

package kstamp

import (
	"net"
	"testing"
	"time"
)

// TestListenStampsTheFirstRead: the first data a fresh listener's
// connection reads is stamped by the kernel, though no other socket asked
// for stamps before (the kernel turns stamping on in deferred work:
// awaitStamping). Without the wait, 9 of 20 such first reads here were
// unstamped. The pause between rounds lets the kernel turn stamping off
// again once the round's sockets are closed.
func TestListenStampsTheFirstRead(t *testing.T) {
	for i := 0; i < 10; i++ {
		ln, err := Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewReader(s.(*net.TCPConn))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Read(make([]byte, 64)); err != nil {
			t.Fatal(err)
		}
		if !r.Kernel() {
			t.Errorf("round %d: the first read of a fresh listener's connection had no kernel stamp", i)
		}
		c.Close()
		s.Close()
		ln.Close()
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNewReaderStampsAPlainConnection: a connection not accepted from
// Listen (no SO_TIMESTAMPNS before NewReader) has its first data stamped
// too.
func TestNewReaderStampsAPlainConnection(t *testing.T) {
	for i := 0; i < 10; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewReader(s.(*net.TCPConn))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Read(make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
		if !r.Kernel() {
			t.Errorf("round %d: the first read of a plain connection had no kernel stamp", i)
		}
		c.Close()
		s.Close()
		ln.Close()
		time.Sleep(50 * time.Millisecond)
	}
}
