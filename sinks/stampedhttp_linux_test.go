//go:build linux

package sinks_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// envStampedHTTP makes the test binary the downstream process of
// startStampedHTTPProcess (TestHTTPWireServerProcess).
const envStampedHTTP = "SHAPER_TEST_HTTP_WIRE_SERVER"

// envStampedEarly (a Go duration) makes the downstream process answer each
// request as soon as it has its head, and read its body that long after,
// with a 16 KiB receive buffer: a server that answers early and reads
// slowly (startEarlyStampedHTTPProcess).
const envStampedEarly = "SHAPER_TEST_HTTP_WIRE_SERVER_EARLY"

// httpArrival is one request as the downstream process saw it.
type httpArrival struct {
	key string    // Idempotency-Key
	at  time.Time // kernel receive time of the segment carrying its request line
	// lag is how long after at the downstream's read of the request line
	// returned: its own scheduling, which the stamp does not depend on.
	lag       time.Duration
	unstamped bool // the kernel gave no stamp; at is the read's time.Now()
	oneRead   bool // the whole request (head and body) came in its first read
	conn      int  // the connection it came on, numbered from 0 in accept order
}

// stampedHTTPProcess is a minimal HTTP/1.1 downstream (keep-alive,
// Content-Length bodies, 204 to everything) in a process of its own: this
// test binary again, running only TestHTTPWireServerProcess. It stamps every
// request with the kernel receive time of its first byte (SO_TIMESTAMPNS on
// the listener, so that accepted sockets inherit it and the first request
// of a fresh connection is stamped too; recvmsg; one byte peeked with
// MSG_PEEK before the request's first read, stampReader), not with when its
// reader was scheduled, which on these loaded cores comes milliseconds later
// (NOTES.md, "Measuring what a downstream sees").
//
// The stamps are exact for HTTP/1.1: a client sends a connection's next
// request only after it has read the response to the previous one, which
// this server writes after it has read the whole request, so every request
// line arrives into an empty receive queue, in a segment of its own that
// TCP cannot merge with an earlier one, however late this process reads.
// oneRead and the lag of each arrival let a test check that.
//
// A process of its own, so that its reads compete with the lane and the
// sink only for the CPU, not for the Go scheduler of the process under test.
type stampedHTTPProcess struct {
	*testProcess
	addr string
}

// startStampedHTTPProcess starts the downstream process; Stop returns what
// it saw. The process is killed on cleanup (and if this one dies).
func startStampedHTTPProcess(t testing.TB) *stampedHTTPProcess {
	t.Helper()
	tp, addr := startTestProcess(t, "downstream", "TestHTTPWireServerProcess", envStampedHTTP+"=1")
	return &stampedHTTPProcess{testProcess: tp, addr: addr}
}

// startEarlyStampedHTTPProcess starts the downstream process in its early
// mode (envStampedEarly): it answers each request once it has read the
// head, and reads the body after readAfter. Each request's stamp is its
// own: the body is read up to its end and no further, so the next
// request's first byte starts the next read.
func startEarlyStampedHTTPProcess(t testing.TB, readAfter time.Duration) *stampedHTTPProcess {
	t.Helper()
	tp, addr := startTestProcess(t, "downstream", "TestHTTPWireServerProcess", envStampedHTTP+"=1", envStampedEarly+"="+readAfter.String())
	return &stampedHTTPProcess{testProcess: tp, addr: addr}
}

// URL is the URL of the downstream.
func (p *stampedHTTPProcess) URL() string { return "http://" + p.addr + "/jobs" }

// Stop ends the downstream process and returns the requests it saw, in the
// order it read them.
func (p *stampedHTTPProcess) Stop() ([]httpArrival, error) {
	p.stopped = true
	_ = p.stdin.Close()
	var got []httpArrival
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
			return nil, fmt.Errorf("downstream process: %v before its report ended", err)
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 7 && f[0] == "R":
			at, _ := strconv.ParseInt(f[2], 10, 64)
			lag, _ := strconv.ParseInt(f[3], 10, 64)
			conn, _ := strconv.Atoi(f[6])
			got = append(got, httpArrival{key: f[1], at: time.Unix(0, at), lag: time.Duration(lag),
				unstamped: f[4] == "1", oneRead: f[5] == "1", conn: conn})
		case len(f) == 1 && f[0] == "END":
			return got, p.cmd.Wait()
		}
	}
}

// TestHTTPWireServerProcess is the body of the downstream process of
// startStampedHTTPProcess, not a test: without its environment it skips.
// It prints "LISTEN <addr>", serves until its stdin closes, then prints
// "R <key> <unix ns> <lag ns> <unstamped> <one read> <conn>" per request and
// "END", and exits.
func TestHTTPWireServerProcess(t *testing.T) {
	if os.Getenv(envStampedHTTP) == "" {
		t.Skip("the downstream process of startStampedHTTPProcess")
	}
	early, _ := time.ParseDuration(os.Getenv(envStampedEarly))
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
			if serr == nil && early > 0 { // inherited by the accepted sockets
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 16<<10)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []httpArrival
	go func() {
		for conn := 0; ; conn++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveStampedHTTP(c.(*net.TCPConn), conn, early, func(a httpArrival) {
				mu.Lock()
				got = append(got, a)
				mu.Unlock()
			})
		}
	}()
	w := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(w, "LISTEN %s\n", ln.Addr())
	_ = w.Flush()
	_, _ = io.Copy(io.Discard, os.Stdin)
	mu.Lock()
	for _, a := range got {
		fmt.Fprintf(w, "R %s %d %d %d %d %d\n", a.key, a.at.UnixNano(), a.lag.Nanoseconds(), b2i(a.unstamped), b2i(a.oneRead), a.conn)
	}
	mu.Unlock()
	fmt.Fprintln(w, "END")
	_ = w.Flush()
	os.Exit(0) // the report is out; no need for the test framework's epilogue
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// serveStampedHTTP serves the requests of one connection: head up to
// CRLFCRLF, then Content-Length bytes of body, then 204. Each request is
// recorded with the stamp of its first read (stampReader). With early > 0
// the 204 goes out once the head is read, and the body is read early later,
// up to its end and no further.
func serveStampedHTTP(c *net.TCPConn, conn int, early time.Duration, record func(httpArrival)) {
	defer c.Close()
	r, err := newStampReader(c)
	if err != nil {
		return
	}
	var buf []byte
	chunk := make([]byte, 64<<10)
	var cur httpArrival
	reads := 0 // reads of the current request; -1: it began in the previous one's
	fill := func(most int) bool {
		n, stamp, err := r.read(chunk[:min(most, len(chunk))])
		if n <= 0 {
			return false
		}
		if len(buf) == 0 {
			cur = httpArrival{at: stamp, lag: time.Since(stamp), unstamped: err != nil, conn: conn}
			reads = 0
		}
		if reads >= 0 {
			reads++
		}
		buf = append(buf, chunk[:n]...)
		return true // an error with data is a missing stamp: the connection is fine
	}
	crlf2 := []byte("\r\n\r\n")
	for {
		end := bytes.Index(buf, crlf2)
		if end < 0 {
			if !fill(len(chunk)) {
				return
			}
			continue
		}
		length := 0
		for _, line := range bytes.Split(buf[:end], []byte("\r\n"))[1:] {
			name, value, ok := bytes.Cut(line, []byte(":"))
			if !ok {
				continue
			}
			switch strings.ToLower(string(bytes.TrimSpace(name))) {
			case "content-length":
				length, _ = strconv.Atoi(string(bytes.TrimSpace(value)))
			case "idempotency-key":
				cur.key = string(bytes.TrimSpace(value))
			}
		}
		if early > 0 {
			if _, err := c.Write([]byte("HTTP/1.1 204 No Content\r\n\r\n")); err != nil {
				return
			}
			time.Sleep(early)
		}
		for len(buf) < end+4+length {
			if !fill(end + 4 + length - len(buf)) {
				return
			}
		}
		cur.oneRead = reads == 1
		record(cur)
		if early == 0 {
			if _, err := c.Write([]byte("HTTP/1.1 204 No Content\r\n\r\n")); err != nil {
				return
			}
		}
		// HTTP/1.1 clients do not pipeline: nothing of the next request
		// should be here yet. If something is, that request keeps this
		// read's stamp and is not marked oneRead.
		buf = append(buf[:0], buf[end+4+length:]...)
		cur.key, reads = "", -1
	}
}
