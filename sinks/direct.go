package sinks

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// direct sends a gated HTTP/1.1 request on the task's own goroutine: the
// goroutine that waited at the gate (shaper.WithGate) writes the request,
// whole, and reads the response. http.Transport hands every HTTP/1.1
// request to a writer goroutine of its connection, which must be woken for
// it; on a busy 2-vCPU VM that wake-up came late by 0.3–3 ms now and then.
// A 5,000/s lane lost 1.05–1.10 % of its rate through the transport and
// 0.70–0.84 % writing on its task's goroutine, with 15 % less CPU per
// request (bench section 11, builds alternated; docs/performance.md,
// session 31). The request is serialized and the response parsed by
// net/http itself (Request.Write, ReadResponse); what is ours is the pool
// of idle connections and their reuse.
//
// It is used only where the transport would do the same and the gate
// matters: a plain http:// URL with no proxy, through the sink's own
// transport (its dialer settings), a body of at most directMaxBody, for a
// request whose task was released before its departure instant
// (shaper.Gate.Early: above 1,000/s). Everything else — TLS and HTTP/2,
// proxies, a caller's client, large bodies, a lane that does not gate or a
// task that started after its instant — goes through the transport, which
// also retries a request on a fresh connection when a kept-alive one was
// closed under its write (at low rates a server's idle timeout meets the
// next request).
type direct struct {
	dialer  *net.Dialer
	maxIdle int // idle connections kept per host

	mu     sync.Mutex
	idle   map[string][]*directConn // by host:port, most recent last
	closed bool
}

// directConn is one keep-alive connection of direct.
type directConn struct {
	net.Conn
	br       *bufio.Reader
	loopback bool
	sent     *sentProbe // what of a write is not yet sent (sent_linux.go)
}

func newDirect(maxIdle int) *direct {
	return &direct{
		dialer:  &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle: maxIdle,
		idle:    make(map[string][]*directConn),
	}
}

// directStaleAfter: a kept-alive connection taken this long before the gate
// opened is looked at again before the write (an overtaken request waits
// intervals there; the lead is at most 200 µs). Found by review: a server's
// idle timeout closed it during the wait, and the write failed.
const directStaleAfter = time.Millisecond

// directMaxBody is the largest body direct writes: it writes the whole
// request before it reads, and a server that answers early (413, 401)
// without reading a large body resets the connection under the write, so
// that its answer is lost (found by review: 16 MiB on loopback, three times
// in three). The transport reads while it writes.
const directMaxBody = 64 << 10

// directBuf holds a serialized request until the gate opens.
var directBuf = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// roundTrip writes req on one connection once its gate opens (wt.openGate:
// the request's departure instant), reports the write (wt.report; exact
// for a loopback peer, as wireConn does), and returns the response; its body returns the
// connection to the pool when read to the end and closed. A kept-alive
// connection is checked before it is used (get), so one the server closed
// while idle is not written into. A failure is the request's: the lane
// retries it (a redelivery).
func (d *direct) roundTrip(req *http.Request, wt *wireTrace) (*http.Response, error) {
	ctx := req.Context()
	buf := directBuf.Get().(*bytes.Buffer)
	buf.Reset()
	defer directBuf.Put(buf)
	if err := req.Write(buf); err != nil {
		return nil, err
	}
	addr := canonicalAddr(req)
	c, err := d.get(ctx, addr)
	if err != nil {
		return nil, err
	}
	stop := c.watch(ctx)
	got := time.Now()
	for {
		// The gate: the departure instant, or a departure of its own for
		// an overtaken request; nothing is written once ctx ended.
		if err := wt.openGate(); err != nil {
			stop()
			_ = c.Close()
			return nil, err
		}
		// After a wait far longer than the lead (an overtaken request's),
		// the server may have closed the kept-alive connection meanwhile:
		// look again, and take another (and the gate again: a dial that
		// took long may have been overtaken).
		if time.Since(got) < directStaleAfter || c.alive() {
			break
		}
		stop()
		_ = c.Close()
		if c, err = d.get(ctx, addr); err != nil {
			return nil, err
		}
		stop = c.watch(ctx)
		got = time.Now()
	}
	var resp *http.Response
	if _, err = c.Write(buf.Bytes()); err == nil {
		c.sent.awaitSent(ctx, buf.Len()) // its first byte on the wire, not only in the send queue
		wt.report(time.Now(), c.loopback)
		resp, err = http.ReadResponse(c.br, req)
		for interim := 0; err == nil && isInterim(resp.StatusCode); interim++ {
			if interim == maxInterim {
				err = errors.New("too many 1xx informational responses")
				break
			}
			resp, err = http.ReadResponse(c.br, req) // 1xx: a header block, then the response
		}
	}
	if err != nil {
		stop()
		_ = c.Close()
		if cerr := endedErr(ctx, err); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	resp.Body = &directBody{ReadCloser: resp.Body, d: d, c: c, addr: addr, stop: stop,
		keep: !resp.Close && !req.Close}
	return resp, nil
}

// endedErr is the error of a call that failed once ctx had ended: ctx's
// own, or context.DeadlineExceeded (with err) when the connection's
// deadline, which is ctx's, fired before ctx reported it ended. The lane
// tells a task timeout by it (drain/task.go); nil while ctx runs.
func endedErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return nil
}

// maxInterim is how many 1xx informational responses (100 Continue, 103
// Early Hints) may come before the response, as http.Transport allows.
const maxInterim = 5

// isInterim reports whether code is an informational response that another
// follows (101 Switching Protocols ends the exchange instead).
func isInterim(code int) bool {
	return code >= 100 && code < 200 && code != http.StatusSwitchingProtocols
}

// canonicalAddr is req's host:port (port 80 when the URL gives none).
func canonicalAddr(req *http.Request) string {
	host, port := req.URL.Hostname(), req.URL.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(host, port)
}

// get returns an idle connection to addr, or dials one under ctx.
func (d *direct) get(ctx context.Context, addr string) (*directConn, error) {
	for {
		d.mu.Lock()
		l := d.idle[addr]
		if len(l) == 0 {
			d.mu.Unlock()
			break
		}
		c := l[len(l)-1]
		d.idle[addr] = l[:len(l)-1]
		d.mu.Unlock()
		if c.alive() {
			return c, nil
		}
		_ = c.Close()
	}
	nc, err := d.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tcp, _ := nc.RemoteAddr().(*net.TCPAddr)
	return &directConn{Conn: nc, br: bufio.NewReaderSize(nc, 4096), loopback: tcp != nil && tcp.IP.IsLoopback(), sent: newSentProbe(nc)}, nil
}

// put keeps c for the next request to addr, or closes it when the pool is
// full or closed.
func (d *direct) put(addr string, c *directConn) {
	d.mu.Lock()
	if !d.closed && len(d.idle[addr]) < d.maxIdle {
		d.idle[addr] = append(d.idle[addr], c)
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	_ = c.Close()
}

// closeIdle closes the idle connections; after it, put closes instead of
// keeping.
func (d *direct) closeIdle() {
	d.mu.Lock()
	idle := d.idle
	d.idle, d.closed = make(map[string][]*directConn), true
	d.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			_ = c.Close()
		}
	}
}

// watch applies ctx to c: its deadline as the connection's, and its end as
// a deadline in the past, which fails the write or read under way. The
// returned stop undoes both (before c is kept).
func (c *directConn) watch(ctx context.Context) (stop func()) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	unwatch := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	return func() {
		unwatch()
		_ = c.SetDeadline(time.Time{})
	}
}

// directBody returns its connection to the pool when the body was read to
// its end and closed, and closes it otherwise (the next response would
// start in the middle of this one).
type directBody struct {
	io.ReadCloser
	d    *direct
	c    *directConn
	addr string
	stop func()
	keep bool
	eof  bool
	done bool
}

func (b *directBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *directBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if !b.eof { // read to its last byte, but not yet told so
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 && err == io.EOF {
			b.eof = true
		}
	}
	b.stop()
	if b.keep && b.eof && b.c.br.Buffered() == 0 {
		err := b.ReadCloser.Close()
		b.d.put(b.addr, b.c)
		return err
	}
	// Not read to its end: close the connection first, so that closing the
	// body (which would read the rest) ends at once.
	_ = b.c.Close()
	_ = b.ReadCloser.Close()
	return nil
}

// directs reports whether send writes req itself (direct) rather than
// through the transport: plain HTTP/1.1 with no proxy for its URL, no
// Expect header (the transport waits for 100-continue; direct would not)
// and a body of at most directMaxBody.
func (s *HTTP) directs(req *http.Request) bool {
	if req.URL.Scheme != "http" || req.Header.Get("Expect") != "" || req.ContentLength > directMaxBody {
		return false
	}
	if s.transport.Proxy != nil {
		if p, err := s.transport.Proxy(req); err != nil || p != nil {
			return false
		}
	}
	return true
}
