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
// unstamped.
func TestListenStampsTheFirstRead(t *testing.T) {
	firstReadsStamped(t, Listen)
}

// TestNewReaderStampsAPlainConnection: a connection not accepted from
// Listen (no SO_TIMESTAMPNS before NewReader) has its first data stamped
// too.
func TestNewReaderStampsAPlainConnection(t *testing.T) {
	firstReadsStamped(t, func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) })
}

// firstReadsStamped checks, for 10 fresh listeners from listen, that the
// first read of an accepted connection (through NewReader) is stamped by
// the kernel. The pause between rounds lets the kernel turn stamping off
// again once the round's sockets are closed.
func firstReadsStamped(t *testing.T, listen func(addr string) (net.Listener, error)) {
	t.Helper()
	for i := 0; i < 10; i++ {
		ln, err := listen("127.0.0.1:0")
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
			t.Errorf("round %d: the first read had no kernel stamp", i)
		}
		c.Close()
		s.Close()
		ln.Close()
		time.Sleep(50 * time.Millisecond)
	}
}
