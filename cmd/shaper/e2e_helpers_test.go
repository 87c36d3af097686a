package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/daemon"
	"github.com/shaper-dev/shaper/internal/kstamp"
	"github.com/shaper-dev/shaper/shaper/shapertest"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/config"
)

// ---------------------------------------------------------------------------
// Arrival times: the kernel's receive timestamps.
//
// Every downstream of these tests records a request at the kernel's receive
// timestamp of its first byte (SO_TIMESTAMPNS, the demo's listenTimestamped
// and newStampedReader), not at the time its handler happened to run: on 2
// loaded cores a handler runs up to tens of milliseconds after the request
// arrived (NOTES.md), which turns an even stream into fake bursts at the
// edges of a window. A stamp is what a remote downstream would see at its
// network card, so the rate windows are judged at their exact bound.

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

// ---------------------------------------------------------------------------
// The downstream: a stamped HTTP server that records every request.

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

// ---------------------------------------------------------------------------
// Configuration.

// laneSpec holds the lane keys the tests vary; the rest are the defaults.
type laneSpec struct {
	name        string // lane name; subjects are e2e.<name>.>
	stream      string
	limit       string // e.g. "100/s"
	capacity    int
	maxInFlight int
	timeout     string // task.timeout
	backoff     string // task.retry.backoff, YAML list
	sinkURL     string
}

// subject is the subject the tests publish the lane's jobs to.
func (l laneSpec) subject() string { return "e2e." + l.name + ".job" }

// configYAML renders a config with the embedded NATS server on natsListen
// (storing in storeDir), the admin endpoint on adminListen, and one lane.
func configYAML(natsListen, storeDir, adminListen, drainTimeout string, l laneSpec) string {
	return fmt.Sprintf(`
nats:
  url: ""
  embedded: { listen: %q, store_dir: %q }
admin: { listen: %q }
log: { level: info, format: text }
shutdown: { drain_timeout: %s }
downstreams:
  %s:
    source: { stream: %s, subjects: [%q], ack_wait: 60s, max_deliver: 5 }
    bucket: { capacity: %d, overflow: block }
    rate: { limit: %s }
    task: { timeout: %s, max_in_flight: %d, retry: { backoff: %s } }
    sink: { kind: http, url: %q, method: POST, success_status: [2xx] }
`, natsListen, storeDir, adminListen, drainTimeout, l.name, l.stream, "e2e."+l.name+".>",
		l.capacity, l.limit, l.timeout, l.maxInFlight, l.backoff, l.sinkURL)
}

// writeFile writes body to name in a fresh temporary directory and returns
// its path.
func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// ---------------------------------------------------------------------------
// The daemon in process.

// syncBuffer is a bytes.Buffer safe for concurrent writers (slog handlers).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testDaemon is a daemon started in the test process.
type testDaemon struct {
	*daemon.Daemon
	cfg     *config.Config
	logs    *syncBuffer
	drained bool
}

// startDaemon loads cfgText the way `shaper run` does and starts the daemon.
// A cleanup drains it (if the test did not) and prints its logs when the
// test failed.
func startDaemon(t *testing.T, cfgText string) *testDaemon {
	t.Helper()
	cfg, warns, err := config.Load(writeFile(t, "config.yaml", cfgText), nil)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	for _, w := range warns {
		t.Logf("config warning: %s", w)
	}
	td, err := startLoaded(t, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	return td
}

// startLoaded starts a daemon for a loaded cfg, capturing its logs, with
// startDaemon's cleanup; a failed Start is returned with the daemon.
func startLoaded(t *testing.T, cfg *config.Config) (*testDaemon, error) {
	t.Helper()
	logs := &syncBuffer{}
	d := daemon.New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), io.Discard)
	td := &testDaemon{Daemon: d, cfg: cfg, logs: logs}
	t.Cleanup(func() {
		if !td.drained {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			td.Drain(ctx)
			cancel()
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", logs.String())
		}
	})
	if err := d.Start(context.Background()); err != nil {
		td.drained = true // Start tore down what it started
		return td, err
	}
	return td, nil
}

// stop drains the daemon now.
func (td *testDaemon) stop(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	td.Drain(ctx)
	td.drained = true
}

// ---------------------------------------------------------------------------
// NATS.

// connectJS connects to the NATS server at url; a cleanup closes the
// connection.
func connectJS(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// msgKey is the Nats-Msg-Id (and so the Idempotency-Key) of job i.
func msgKey(i int) string { return fmt.Sprintf("msg-%04d", i) }

// publishBurst publishes n jobs to subject at once, as fast as the server
// takes them, with Nats-Msg-Id msg-0000… and the sequence in the payload,
// and waits for every publish ack. It returns the keys in publish order.
func publishBurst(t *testing.T, js jetstream.JetStream, subject string, n int) []string {
	t.Helper()
	keys := make([]string, 0, n)
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: fmt.Appendf(nil, `{"seq":%d}`, i)}
		msg.Header.Set(jetstream.MsgIDHeader, msgKey(i))
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		futures = append(futures, f)
		keys = append(keys, msgKey(i))
	}
	timeout := time.After(10 * time.Second)
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("publish %d: %v", i, err)
		case <-timeout:
			t.Fatalf("publish acks: timed out at %d of %d", i, n)
		}
	}
	return keys
}

// waitConsumerSettled polls the consumer until nothing is pending or
// unacknowledged (acks are fire-and-forget), or fails after timeout.
func waitConsumerSettled(t *testing.T, js jetstream.JetStream, stream, consumer string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := js.Consumer(ctx, stream, consumer)
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = c.Info(ctx)
		}
		cancel()
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("NumPending %d, NumAckPending %d, NumRedelivered %d",
				info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		if time.Now().After(deadline) {
			t.Errorf("consumer %s/%s not settled after %s: %s", stream, consumer, timeout, last)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Admin endpoint.

// httpGet returns the status and body of GET url.
func httpGet(url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	c.CloseIdleConnections()
	return resp.StatusCode, string(b), err
}

// waitReady polls http://addr/readyz until it answers 200, or fails.
func waitReady(t *testing.T, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		code, body, err := httpGet("http://" + addr + "/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 after %s: code %d, body %q, err %v", timeout, code, strings.TrimSpace(body), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape reads http://addr/metrics and parses the samples. It understands
// what client_golang writes (no escapes in label values, no timestamps).
func scrape(t *testing.T, addr string) []sample {
	t.Helper()
	code, body, err := httpGet("http://" + addr + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: code %d, err %v", code, err)
	}
	var out []sample
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		s := sample{labels: map[string]string{}, value: v}
		head := line[:sp]
		if i := strings.IndexByte(head, '{'); i >= 0 {
			s.name = head[:i]
			for _, pair := range strings.Split(strings.TrimSuffix(head[i+1:], "}"), ",") {
				k, val, _ := strings.Cut(pair, "=")
				s.labels[k] = strings.Trim(val, `"`)
			}
		} else {
			s.name = head
		}
		out = append(out, s)
	}
	return out
}

// metricValue returns the value of the series name{labels}, failing the
// test when it is missing.
func metricValue(t *testing.T, samples []sample, name string, labels map[string]string) float64 {
	t.Helper()
next:
	for _, s := range samples {
		if s.name != name || len(s.labels) != len(labels) {
			continue
		}
		for k, v := range labels {
			if s.labels[k] != v {
				continue next
			}
		}
		return s.value
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

// ---------------------------------------------------------------------------
// The binary, built once per test run.

var shaperBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// buildShaper builds the shaper binary once per run of the package's tests
// (TestMain removes it) and returns its path.
func buildShaper(t *testing.T) string {
	t.Helper()
	shaperBin.once.Do(func() {
		goTool, err := exec.LookPath("go") // go test puts its own toolchain first on PATH
		if err != nil {
			shaperBin.err = err
			return
		}
		if shaperBin.dir, err = os.MkdirTemp("", "shaper-e2e-bin-"); err != nil {
			shaperBin.err = err
			return
		}
		shaperBin.path = filepath.Join(shaperBin.dir, "shaper")
		start := time.Now()
		cmd := exec.Command(goTool, "build", "-o", shaperBin.path, "github.com/shaper-dev/shaper/cmd/shaper")
		if out, err := cmd.CombinedOutput(); err != nil {
			shaperBin.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		t.Logf("built %s in %s", shaperBin.path, time.Since(start).Round(time.Millisecond))
	})
	if shaperBin.err != nil {
		t.Fatal(shaperBin.err)
	}
	return shaperBin.path
}

func removeShaperBin() {
	if shaperBin.dir != "" {
		_ = os.RemoveAll(shaperBin.dir)
	}
}

// child is the shaper binary running as a child process; its stdout and
// stderr go to files.
type child struct {
	cmd    *exec.Cmd
	stderr string // path of the stderr file
	done   chan struct{}
	err    error // of Wait, valid once done is closed
}

// startChild starts bin with args; a cleanup kills it if it still runs, and
// prints its stderr when the test failed or SHAPER_E2E_CHILD_LOGS is set.
func startChild(t *testing.T, bin string, args ...string) *child {
	t.Helper()
	dir := t.TempDir()
	outF, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errF, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(bin, args...), stderr: errF.Name(), done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = outF, errF
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = outF.Close()
	_ = errF.Close()
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() || os.Getenv("SHAPER_E2E_CHILD_LOGS") != "" {
			t.Logf("child %v stderr:\n%s", args, c.stderrText())
		}
	})
	return c
}

func (c *child) stderrText() string {
	b, _ := os.ReadFile(c.stderr)
	return string(b)
}

// wait waits up to timeout for the child to exit and returns its exit code
// (-1 and false on timeout).
func (c *child) wait(timeout time.Duration) (int, bool) {
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return -1, false
	}
}

// newStampedDownstream is a downstream that answers 204 to everything, and
// the URL to configure.
func newStampedDownstream(t *testing.T) (*downstream, string) {
	t.Helper()
	d := newDownstream(t, nil)
	return d, d.url()
}
