package main

// The downstream of the end-to-end tests: a stamped HTTP server that
// records every request, and the window checks of its arrivals.
//
// Arrival times are the kernel's receive timestamps. Every downstream of
// these tests records a request at the kernel's receive timestamp of its
// first byte (SO_TIMESTAMPNS, the demo's listenTimestamped and
// newStampedReader), not at the time its handler happened to run: on 2
// loaded cores a handler runs up to tens of milliseconds after the request
// arrived (NOTES.md), which turns an even stream into fake bursts at the
// edges of a window. A stamp is what a remote downstream would see at its
// network card, so the rate windows are judged at their exact bound.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/kstamp"
	"github.com/shaper-dev/shaper/shaper/shapertest"
)

// stampedConn is an accepted connection read through kstamp.NewReader. It
// keeps the arrival of the request being served: the stamp of the first
// read after the previous request on the connection was answered.
type stampedConn struct {
	net.Conn // an interface, not *net.TCPConn: nothing reads past Read (WriteTo)
	r        *kstamp.Reader

	mu    sync.Mutex
	armed bool      // the next read starts a request
	at    time.Time // arrival of the current request
}

func (c *stampedConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.mu.Lock()
		if c.armed {
			c.at, c.armed = c.r.Last(), false
		}
		c.mu.Unlock()
	}
	return n, err
}

// arrival returns the arrival of the current request.
func (c *stampedConn) arrival() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

// rearm makes the next read the start of the next request. It runs before
// the response is flushed, and HTTP/1.1 clients send the next request on a
// connection only after the response: the next read with data is that
// request's first byte (also when net/http's background read gets it).
func (c *stampedConn) rearm() {
	c.mu.Lock()
	c.armed = true
	c.mu.Unlock()
}

type stampedListener struct{ net.Listener }

func (l stampedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	r, err := kstamp.NewReader(c.(*net.TCPConn))
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &stampedConn{Conn: c, r: r, armed: true}, nil
}

type stampedConnKey struct{}

// newStampedServer starts an HTTP test server on a timestamping listener;
// h gets each request with its arrival (the kernel receive timestamp of its
// first byte) and its body read in full. A cleanup closes the server.
func newStampedServer(t *testing.T, h func(w http.ResponseWriter, r *http.Request, at time.Time)) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := r.Context().Value(stampedConnKey{}).(*stampedConn)
		at := c.arrival()
		// The whole body now: its end starts net/http's background read,
		// which notices a client that goes away (r.Context() is done), and
		// nothing of this request is read after rearm.
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		defer c.rearm()
		h(w, r, at)
	}))
	ln, err := kstamp.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = srv.Listener.Close()
	srv.Listener = stampedListener{ln}
	srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, stampedConnKey{}, c)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// arrival is one request seen by the downstream.
type arrival struct {
	at      time.Time // kernel receive timestamp of the request's first byte
	key     string    // Idempotency-Key
	attempt int       // this key's attempt number as counted by the downstream (1 = first)
	ok      bool      // answered 204 (false: hung until the client gave up)
}

// downstream records arrivals (kernel receive time, Idempotency-Key,
// attempt) and answers 204, except for the requests hang selects: those
// block until the client goes away (the task timeout closes the connection).
type downstream struct {
	srv  *httptest.Server
	hang func(key string, attempt int) bool

	mu       sync.Mutex
	arrivals []arrival
	attempts map[string]int // key -> requests seen
	ok       map[string]int // key -> 204s answered
}

func newDownstream(t *testing.T, hang func(key string, attempt int) bool) *downstream {
	t.Helper()
	d := &downstream{hang: hang, attempts: map[string]int{}, ok: map[string]int{}}
	d.srv = newStampedServer(t, d.serveHTTP)
	return d
}

func (d *downstream) url() string { return d.srv.URL + "/callback" }

func (d *downstream) serveHTTP(w http.ResponseWriter, r *http.Request, at time.Time) {
	key := r.Header.Get("Idempotency-Key")
	d.mu.Lock()
	d.attempts[key]++
	n := d.attempts[key]
	d.mu.Unlock()
	if d.hang != nil && d.hang(key, n) {
		<-r.Context().Done()
		d.mu.Lock()
		d.arrivals = append(d.arrivals, arrival{at: at, key: key, attempt: n})
		d.mu.Unlock()
		return
	}
	d.mu.Lock()
	d.arrivals = append(d.arrivals, arrival{at: at, key: key, attempt: n, ok: true})
	d.ok[key]++
	d.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// snapshot returns the arrivals so far, in arrival-time order, and a copy of
// the per-key 204 counts.
func (d *downstream) snapshot() ([]arrival, map[string]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := slices.Clone(d.arrivals)
	slices.SortStableFunc(a, func(x, y arrival) int { return x.at.Compare(y.at) })
	ok := make(map[string]int, len(d.ok))
	for k, v := range d.ok {
		ok[k] = v
	}
	return a, ok
}

func (d *downstream) distinctDelivered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ok)
}

func (d *downstream) attemptsOf(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.attempts[key]
}

// waitDistinct waits until n distinct keys were answered 204, or fails the
// test after timeout.
func (d *downstream) waitDistinct(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	if !d.awaitDistinct(n, timeout) {
		t.Fatalf("after %s only %d of %d distinct keys were delivered", timeout, d.distinctDelivered(), n)
	}
}

// awaitDistinct waits until n distinct keys were answered 204 and reports
// whether that happened within timeout.
func (d *downstream) awaitDistinct(n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for d.distinctDelivered() < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// missing returns the keys of keys never answered 204.
func (d *downstream) missing(keys []string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, k := range keys {
		if d.ok[k] == 0 {
			out = append(out, k)
		}
	}
	return out
}

// times returns the arrival times of the arrivals a.
func times(a []arrival) []time.Time {
	ts := make([]time.Time, len(a))
	for i, x := range a {
		ts[i] = x.at
	}
	return ts
}

// maxInWindow returns the largest number of instants of ts (sorted) in any
// half-open window [t, t+w), and where that window starts. The maximum over
// all windows is reached by a window starting at one of the instants.
func maxInWindow(ts []time.Time, w time.Duration) (int, time.Time) {
	return shapertest.MaxInWindow(ts, w)
}

// gapSummary describes the gaps between consecutive instants of ts (sorted):
// min, median, p99 and max.
func gapSummary(ts []time.Time) string {
	if len(ts) < 2 {
		return "-"
	}
	gaps := make([]time.Duration, 0, len(ts)-1)
	for i := 1; i < len(ts); i++ {
		gaps = append(gaps, ts[i].Sub(ts[i-1]))
	}
	slices.Sort(gaps)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("min %s, median %s, p99 %s, max %s", r(gaps[0]), r(gaps[len(gaps)/2]),
		r(gaps[len(gaps)*99/100]), r(gaps[len(gaps)-1]))
}

// assertRate fails the test when more than maxN of ts fall in a window of w.
func assertRate(t *testing.T, what string, ts []time.Time, w time.Duration, maxN int) {
	t.Helper()
	n, at := maxInWindow(ts, w)
	if n > maxN {
		i, _ := slices.BinarySearchFunc(ts, at, func(x, y time.Time) int { return x.Compare(y) })
		win := ts[i : i+n]
		t.Errorf("%s: %d arrivals in the %s window starting %s after the first arrival; want at most %d (first to last in it %s; gaps %s)",
			what, n, w, at.Sub(ts[0]).Round(time.Microsecond), maxN, win[n-1].Sub(win[0]), gapSummary(win))
	}
}

// newStampedDownstream is a downstream that answers 204 to everything, and
// the URL to configure.
func newStampedDownstream(t *testing.T) (*downstream, string) {
	t.Helper()
	d := newDownstream(t, nil)
	return d, d.url()
}
