package main

// Section 11 (issue 15, "HTTP sink at 5,000/s on this machine"): a real lane
// delivering through the real HTTP sink to a downstream in another process,
// side by side with a bare net/http client loop sending at the same rate to
// the same downstream. The downstream stamps every request with the kernel's
// receive time (internal/kstamp), so the rate and the windows are what it
// saw, not what the sender believed; the CPU is the sending process's own
// (getrusage RUSAGE_SELF), so the downstream's is not in it.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/time/rate"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/internal/kstamp"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/shaper/shapertest"
	"github.com/shaper-dev/shaper/sinks"
)

// envHTTPDownstream, set to 1, makes the bench binary the downstream process
// of section 11 (serveHTTPDownstream). Not SHAPER_…: that prefix is the
// daemon's configuration.
const envHTTPDownstream = "SHAPERBENCH_HTTP_DOWNSTREAM"

// envHTTPOnly, set to a contender's label (lane-http, bare, paced,
// lane-noop), runs only that row of section 11: for `perf stat` or a profile
// of one sender.
const envHTTPOnly = "SHAPERBENCH_HTTP_ONLY"

// httpRate is section 11's rate (issue 15), httpMaxErrPct its bound on the
// delivered rate against it.
const (
	httpRate      = 5000.0
	httpMaxErrPct = 0.5
)

// httpWindows are the windows section 11 reports at the downstream.
var httpWindows = []time.Duration{time.Second, 100 * time.Millisecond, 10 * time.Millisecond}

// marginWindows are the window lengths whose margin section 11 reports.
var marginWindows = []time.Duration{10 * time.Millisecond, time.Millisecond}

// httpRow is one contender of section 11.
type httpRow struct {
	name, what string
	n          int     // requests the downstream received
	achieved   float64 // (n − 1) / (last − first stamp), per second
	errPct     float64
	win        []int         // most requests in a closed window of each httpWindows length
	maxGap     time.Duration // longest time between two consecutive requests
	// margin is, for each marginWindows length W, how far the closest
	// W × limit + 2 requests were spread beyond W (the span of one more
	// than G1's bound, less W): positive when every such window held G1.
	margin []time.Duration
	// other is the closest that requests came at the downstream to G1's
	// bound for windows of other lengths than a whole number of
	// intervals (shapertest.Others).
	other shapertest.Other
	// pairs are the lane's (departure, wire report) of each request, by
	// departure (runLaneHTTP); closest joins them with the stamps of the
	// closest window of marginWindows[0] (joinClosest).
	pairs       [][2]time.Time
	closest     *closestWindow
	cpuPerReq   time.Duration
	allocs      float64         // heap allocations per request, sending process
	wire, start []time.Duration // quantiles (httpQuantiles) of departure → wire report, → Send
	next        []time.Duration // quantiles of wire report → next departure
	wireMean    time.Duration   // mean departure → wire delay
	wireExcess  time.Duration   // mean excess of that delay over its mean (meanExcess)
	// forgivenLate and forgivenWire are what the lane's schedule gave up
	// (shaper_departure_lateness_forgiven_seconds_total, cause late, wire).
	forgivenLate, forgivenWire time.Duration
	floor                      *floorAccount // the floor row's (runFloorHTTP)
	conns                      int           // TCP connections the downstream accepted
	unstamped                  int           // requests the kernel gave no stamp (stamped at the read)
	downCPU                    time.Duration
	load                       float64
	err                        error
}

// httpContenders are the rows of section 11, in order.
func httpContenders() []struct {
	name, label, what string
	// run sends n requests to url; it may fill the row's delays (the lane).
	run func(url string, n int, row *httpRow) (sent int, m meterResult, err error)
} {
	return []struct {
		name, label, what string
		run               func(url string, n int, row *httpRow) (int, meterResult, error)
	}{
		{"shaper lane, HTTP sink", "lane-http", "drain.New (defaults: capacity 1000, max_in_flight 8, min_spacing 0.95, the precise waiter) on an in-memory source (bench/diag.go memSource: no NATS, its cost is excluded) with sinks.NewHTTP as the daemon builds it (sink.url, a Content-Type header, WithMaxIdleConnsPerHost(64)); 256-byte bodies", runLaneHTTP},
		{"bare net/http loop", "bare", "8 goroutines sharing rate.NewLimiter(5000, 8) (burst 1 tops out near 1,840/s here, NOTES.md); each Wait, then http.Client.Do of a POST with the same body, Content-Type and Idempotency-Key, body drained and closed; http.Transport with MaxIdleConnsPerHost 8 (keep-alive)", runBareHTTP},
		{"bare net/http, evenly paced", "paced", "the bare loop's client and requests, released evenly instead: one goroutine on drain.NewPreciseWaiter to absolute instants one interval apart (lag above 0.9 interval forgiven) hands each request to one of 8 workers; what pacing one request at a time costs net/http and the kernel, without the lane", runPacedHTTP},
		{httpFloorName, "floor", "no HTTP client and no lane: pre-built HTTP/1.1 requests (the same head fields and body) written whole to 8 keep-alive connections, one at a time, on drain.NewPreciseWaiter at instants one interval apart, each no earlier than the previous write's return (the most a G1 sender may make up, one interval); what the machine takes from a sending process that does nothing else (bench/httpfloor.go)", runFloorHTTP},
		{"shaper lane, no-op sink", "lane-noop", "the same lane with a sink that returns at once (no HTTP, no wire report): the lane's own share of the first row; no downstream, so its rate is from the Sends' instants and it has no windows", nil},
	}
}

// httpFloorName is the floor row's name (bench/httpfloor.go).
const httpFloorName = "floor: raw writes, evenly paced"

// meterResult is what a meter measured over one run.
type meterResult struct {
	cpu     time.Duration
	mallocs uint64
	load    float64
}

func measureRun(f func() error) (meterResult, error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m0 := ms.Mallocs
	lm := startLoad()
	c0 := cpuTime()
	err := f()
	cpu := cpuTime() - c0
	runtime.ReadMemStats(&ms)
	return meterResult{cpu: cpu, mallocs: ms.Mallocs - m0, load: lm.other()}, err
}

// runHTTPSection measures section 11: each contender for d at httpRate
// against a fresh downstream process.
func runHTTPSection(d time.Duration, quiet func(), logf func(string, ...any)) (rows []httpRow, problems []string) {
	n := int(httpRate * d.Seconds())
	only := os.Getenv(envHTTPOnly)
	for _, c := range httpContenders() {
		if only != "" && c.label != only {
			continue
		}
		quiet()
		row := httpRow{name: c.name, what: c.what}
		// The label lets a profile of the run be read per contender:
		// go tool pprof -tagfocus sender=bare (goroutines inherit it: the
		// lane's, the transport's connection loops; pprof splits a
		// -tagfocus value at commas, hence the short names).
		pprof.Do(context.Background(), pprof.Labels("sender", c.label), func(context.Context) {
			if c.run == nil { // the no-op sink: no downstream
				row = runLaneNoop(n)
				row.name, row.what = c.name, c.what
			} else {
				row = measureHTTP(c.name, c.what, c.run, n)
			}
		})
		if row.err != nil {
			problems = append(problems, fmt.Sprintf("HTTP %s: %v", c.name, row.err))
		}
		rows = append(rows, row)
		logf("http %-26s %d requests: achieved %.1f/s (%s %%), cpu %s µs/request, %.1f allocs/request, windows %v, longest gap %s, %d connections, departure→wire %v, →Send %v, wire→next departure %v, wire mean %s excess %s, other load %.0f %%",
			row.name, row.n, row.achieved, fmtPct(row.errPct), fmtUs(row.cpuPerReq), row.allocs, row.win, row.maxGap, row.conns, row.wire, row.start, row.next, fmtUs(row.wireMean), fmtUs(row.wireExcess), 100*row.load)
	}
	return rows, problems
}

func measureHTTP(name, what string, run func(string, int, *httpRow) (int, meterResult, error), n int) httpRow {
	row := httpRow{name: name, what: what}
	down, err := startHTTPDownstream()
	if err != nil {
		row.err = err
		return row
	}
	sent, m, err := run(down.url, n, &row)
	seen, derr := down.stop()
	row.err = errors.Join(err, derr)
	row.cpuPerReq = m.cpu / time.Duration(max(sent, 1))
	row.allocs = float64(m.mallocs) / float64(max(sent, 1))
	row.load = m.load
	row.conns, row.unstamped, row.downCPU = seen.conns, seen.unstamped, seen.cpu
	row.fillRate(seen.at)
	row.closest = joinClosest(seen.at, row.pairs, marginWindows[0])
	if row.err == nil && row.n != n {
		row.err = fmt.Errorf("the downstream received %d of %d requests", row.n, n)
	}
	return row
}

// closestWindow is the closest window of bound + 1 requests at the
// downstream's stamps (the one whose margin section 11 reports), joined
// with the same requests' departures and wire reports: where a window that
// comes near G1's bound lost its span.
type closestWindow struct {
	first                    int           // its first request, in stamp order
	stamps, departs, reports time.Duration // the span of its requests at each
	// firstAfter and lastAfter are the time from the first and the last
	// request's stamp to its wire report (the stamp is taken inside the
	// connection's Write, the report after it returned).
	firstAfter, lastAfter time.Duration
	fast                  time.Duration // the quickest departure → wire report of the run, from the second request
	// fastThen is the quickest departure → wire report of the requests up
	// to the window's first (from the second: the first pays the dial),
	// the pacer's judge when that one's report came (Pacer.Wire); 0 when
	// the window starts at the first request.
	fastThen   time.Duration
	misordered int // requests stamped before their own departure (the join is off)
}

// closestSpan returns the first request and the span of the closest window
// of w × httpRate + 2 requests (one more than G1's bound) at the sorted
// instants at; ok is false when at holds no such window.
func closestSpan(at []time.Time, w time.Duration) (first int, span time.Duration, ok bool) {
	k := int(w.Seconds()*httpRate) + 1 // bound + 1 requests span k gaps
	if len(at) <= k {
		return 0, 0, false
	}
	span = at[k].Sub(at[0])
	for i := 1; i+k < len(at); i++ {
		if d := at[i+k].Sub(at[i]); d < span {
			first, span = i, d
		}
	}
	return first, span, true
}

// joinClosest finds the closest window of w × httpRate + 2 requests at the
// sorted stamps at and joins it with pairs, the (departure, wire report) of
// each request by departure: the k-th stamp is the k-th departure's, since
// the lane holds each departure until the previous one's wire report. It
// returns nil when the counts differ (not the lane, or a request lost).
func joinClosest(at []time.Time, pairs [][2]time.Time, w time.Duration) *closestWindow {
	if len(pairs) != len(at) {
		return nil
	}
	first, span, ok := closestSpan(at, w)
	if !ok {
		return nil
	}
	c := &closestWindow{first: first, stamps: span}
	// The quickest delay counts from the second request (the first pays
	// the dial); fastThen is it once the window's first request reported:
	// how slow the run's start was (the pacer judges the whole delay above
	// 1,000/s, shaper.Pacer.Wire).
	for j := range at {
		if at[j].Before(pairs[j][0]) {
			c.misordered++
		}
		if j == 0 {
			continue
		}
		if d := pairs[j][1].Sub(pairs[j][0]); j == 1 || d < c.fast {
			c.fast = d
		}
		if j == first {
			c.fastThen = c.fast
		}
	}
	i, k := first, int(w.Seconds()*httpRate)+1
	c.departs = pairs[i+k][0].Sub(pairs[i][0])
	c.reports = pairs[i+k][1].Sub(pairs[i][1])
	c.firstAfter = pairs[i][1].Sub(at[i])
	c.lastAfter = pairs[i+k][1].Sub(at[i+k])
	return c
}

// fillRate fills n, achieved, errPct and win from the sorted instants at.
func (r *httpRow) fillRate(at []time.Time) {
	r.n = len(at)
	if len(at) < 2 {
		return
	}
	r.achieved = float64(len(at)-1) / at[len(at)-1].Sub(at[0]).Seconds()
	r.errPct = (r.achieved - httpRate) / httpRate * 100
	off := make([]time.Duration, len(at))
	for i := range at {
		off[i] = at[i].Sub(at[0])
		if i > 0 {
			r.maxGap = max(r.maxGap, off[i]-off[i-1])
		}
	}
	// Beyond 1 / (1 − min_spacing) gaps the whole windows are the
	// stricter bound (shaper.Pacer's spanLast).
	r.other = shapertest.Others(at, httpRate, shaper.DefaultMinSpacing, shaper.BatchWindow,
		int(math.Ceil(1/(1-shaper.DefaultMinSpacing)))+1)
	for _, w := range marginWindows {
		if _, least, ok := closestSpan(at, w); ok {
			r.margin = append(r.margin, least-w)
		}
	}
	for _, w := range httpWindows {
		if off[len(off)-1] < w {
			r.win = append(r.win, -1)
			continue
		}
		r.win = append(r.win, maxInWindow(off, w))
	}
}

// httpLaneConfig is the lane of section 11, as config.Load builds it with
// the defaults, sink kind http at url.
func httpLaneConfig(url string) config.Lane {
	cfg := laneConfig("MEM", "mem.>", "none", httpRate, 0)
	cfg.Sink = config.Sink{Kind: config.SinkHTTP, URL: url, Headers: map[string]string{"Content-Type": "application/json"}}
	return cfg
}

// countingSink counts the Sends that returned (success or not) and closes
// done at target. Embedding keeps the sink's ReportsWire and Close.
// With wire reports, it records each request's delay from its departure to
// the report (wired − Message.Departed) and when the task began.
type countingSink struct {
	drain.Sink
	target int64
	n      atomic.Int64
	failed atomic.Int64
	done   chan struct{}

	mu    sync.Mutex
	wire  []time.Duration // departure → wire report
	start []time.Duration // departure → Send called (the task goroutine ran)
	pairs [][2]time.Time  // (departure, wire report) of each request

	metrics *metrics.Lane // the lane's series (runLaneOnSink)
}

// forgiven returns what the lane's schedule gave up, by cause
// (shaper_departure_lateness_forgiven_seconds_total).
func (s *countingSink) forgiven() (late, wire time.Duration) {
	sec := func(c prometheus.Counter) time.Duration {
		var m dto.Metric
		if c.Write(&m) != nil {
			return 0
		}
		return time.Duration(m.GetCounter().GetValue() * float64(time.Second))
	}
	return sec(s.metrics.ForgivenLate), sec(s.metrics.ForgivenWire)
}

// byDeparture returns a copy of the (departure, wire report) pairs, sorted
// by departure.
func (s *countingSink) byDeparture() [][2]time.Time {
	s.mu.Lock()
	ps := slices.Clone(s.pairs)
	s.mu.Unlock()
	slices.SortFunc(ps, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	return ps
}

// wireToNext returns, for each request but the last of ps (by departure),
// the time from its wire report to the next departure: how long the lane's
// hold on the wire (and the pacer) kept the next one.
func wireToNext(ps [][2]time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(ps); i++ {
		out = append(out, ps[i][0].Sub(ps[i-1][1]))
	}
	return out
}

func (s *countingSink) Send(ctx context.Context, m *shaper.Message) error {
	began := time.Since(m.Departed)
	if wire := shaper.WireFrom(ctx); wire != nil {
		ctx = shaper.WithWire(ctx, func(t time.Time, exact bool) {
			s.mu.Lock()
			s.wire = append(s.wire, t.Sub(m.Departed))
			s.start = append(s.start, began)
			s.pairs = append(s.pairs, [2]time.Time{m.Departed, t})
			s.mu.Unlock()
			wire(t, exact)
		})
	}
	err := s.Sink.Send(ctx, m)
	if err != nil {
		s.failed.Add(1)
	}
	if s.n.Add(1) == s.target {
		close(s.done)
	}
	return err
}

// wiredSink is countingSink for a sink that reports the wire.
type wiredSink struct{ *countingSink }

func (wiredSink) ReportsWire() bool { return true }

// GatesWire passes the sink's own (drain.WireGater): the lane releases its
// departures a lead early only to a sink that gates their writes.
func (w wiredSink) GatesWire() bool {
	g, ok := w.Sink.(drain.WireGater)
	return ok && g.GatesWire()
}

// runLaneOnSink runs the lane cfg over n in-memory messages into sink and
// measures it from Start to the n-th Send's return.
func runLaneOnSink(cfg config.Lane, sink drain.Sink, wire bool, n int) (int, meterResult, *countingSink, error) {
	cs := &countingSink{Sink: sink, target: int64(n), done: make(chan struct{})}
	var s drain.Sink = cs
	if wire {
		s = wiredSink{cs}
	}
	cs.metrics = metrics.New(prometheus.NewRegistry()).Lane("bench", float64(cfg.Rate.Limit))
	lane, err := drain.New("bench", cfg, newMemSource(n), s, drain.WithMetrics(cs.metrics))
	if err != nil {
		return 0, meterResult{}, nil, err
	}
	timeout := time.Duration(float64(n)/float64(cfg.Rate.Limit)*float64(time.Second)) + 30*time.Second
	defer shaperGC()()
	m, err := measureRun(func() error {
		lane.Start()
		select {
		case <-cs.done:
			return nil
		case <-time.After(timeout):
			return fmt.Errorf("timed out: %d of %d sent", cs.n.Load(), n)
		}
	})
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	lane.Drain(dctx)
	cancel()
	if f := cs.failed.Load(); f > 0 && err == nil {
		err = fmt.Errorf("%d of %d sends failed", f, n)
	}
	return int(cs.n.Load()), m, cs, err
}

// httpQuantiles are the quantiles reported of the departure → wire delays.
var httpQuantiles = []float64{0.5, 0.9, 0.99, 0.999}

func delayQuantiles(xs []time.Duration) []time.Duration {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	var q []time.Duration
	for _, p := range httpQuantiles {
		q = append(q, quantile(xs, p))
	}
	return q
}

// meanExcess returns the mean of xs and the mean of its excess over that
// mean, max(x − mean, 0): up to 1,000/s, with the spacing floor anchored at
// each request's wire report less the usual delay (shaper.Pacer.Wire),
// every request later than usual pushes the next departure back by its
// excess, so the excess is (up to the make-up of (1 − min_spacing) per
// departure) the lane's lost time per request; above, where the floor
// stays at the departures, it is what the lane no longer pays.
func meanExcess(xs []time.Duration) (mean, excess time.Duration) {
	if len(xs) == 0 {
		return 0, 0
	}
	var sum time.Duration
	for _, x := range xs {
		sum += x
	}
	mean = sum / time.Duration(len(xs))
	for _, x := range xs {
		excess += max(x-mean, 0)
	}
	return mean, excess / time.Duration(len(xs))
}

// runLaneHTTP runs the lane through the HTTP sink and fills row's delays.
func runLaneHTTP(url string, n int, row *httpRow) (int, meterResult, error) {
	cfg := httpLaneConfig(url)
	sink, err := sinks.NewHTTP(sinks.HTTPConfig{URL: cfg.Sink.URL, Headers: cfg.Sink.Headers},
		sinks.WithMaxIdleConnsPerHost(max(sinks.DefaultMaxIdleConnsPerHost, cfg.Task.MaxInFlight)))
	if err != nil {
		return 0, meterResult{}, err
	}
	defer sink.Close()
	sent, m, cs, err := runLaneOnSink(cfg, sink, sink.ReportsWire(), n)
	if cs != nil {
		cs.mu.Lock()
		row.wire, row.start = delayQuantiles(cs.wire), delayQuantiles(cs.start)
		row.wireMean, row.wireExcess = meanExcess(cs.wire)
		cs.mu.Unlock()
		row.pairs = cs.byDeparture()
		row.next = delayQuantiles(wireToNext(row.pairs))
		row.forgivenLate, row.forgivenWire = cs.forgiven()
	}
	return sent, m, err
}

// noopSink stamps each Send and returns at once.
type noopSink struct {
	mu sync.Mutex
	at []time.Time
}

func (s *noopSink) Send(context.Context, *shaper.Message) error {
	now := time.Now()
	s.mu.Lock()
	s.at = append(s.at, now)
	s.mu.Unlock()
	return nil
}

func runLaneNoop(n int) httpRow {
	var row httpRow
	s := &noopSink{at: make([]time.Time, 0, n)}
	sent, m, _, err := runLaneOnSink(httpLaneConfig("http://127.0.0.1:1/unused"), s, false, n)
	row.err = err
	row.cpuPerReq = m.cpu / time.Duration(max(sent, 1))
	row.allocs = float64(m.mallocs) / float64(max(sent, 1))
	row.load = m.load
	s.mu.Lock()
	at := slices.Clone(s.at)
	s.mu.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	row.fillRate(at)
	return row
}

// bareWorkers is the bare loop's concurrency, the lane's default
// max_in_flight.
const bareWorkers = config.DefaultMaxInFlight

// runBareHTTP is what a user would write instead of shaper: a keep-alive
// client, a shared limiter, a few goroutines.
func runBareHTTP(url string, n int, _ *httpRow) (int, meterResult, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: bareWorkers}}
	defer client.CloseIdleConnections()
	lim := rate.NewLimiter(rate.Limit(httpRate), bareWorkers)
	body := make([]byte, payloadSize)
	var next, sent atomic.Int64
	var firstErr atomic.Pointer[error]
	ctx := context.Background()
	m, _ := measureRun(func() error {
		var wg sync.WaitGroup
		for range bareWorkers {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > int64(n) {
						return
					}
					if err := lim.Wait(ctx); err != nil {
						firstErr.CompareAndSwap(nil, &err)
						return
					}
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
					if err != nil {
						firstErr.CompareAndSwap(nil, &err)
						return
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", "MEM:"+strconv.FormatInt(i, 10))
					resp, err := client.Do(req)
					if err != nil {
						firstErr.CompareAndSwap(nil, &err)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					sent.Add(1)
				}
			})
		}
		wg.Wait()
		return nil
	})
	var err error
	if p := firstErr.Load(); p != nil {
		err = *p
	}
	return int(sent.Load()), m, err
}

// runPacedHTTP is runBareHTTP's client with even departures: the cost of
// pacing one request at a time, apart from the lane's.
func runPacedHTTP(url string, n int, _ *httpRow) (int, meterResult, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: bareWorkers}}
	defer client.CloseIdleConnections()
	body := make([]byte, payloadSize)
	var sent atomic.Int64
	var firstErr atomic.Pointer[error]
	ctx := context.Background()
	jobs := make(chan int, bareWorkers)
	m, _ := measureRun(func() error {
		var wg sync.WaitGroup
		for range bareWorkers {
			wg.Go(func() {
				for i := range jobs {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
					if err != nil {
						firstErr.CompareAndSwap(nil, &err)
						continue
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", "MEM:"+strconv.Itoa(i))
					resp, err := client.Do(req)
					if err != nil {
						firstErr.CompareAndSwap(nil, &err)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					sent.Add(1)
				}
			})
		}
		w := drain.NewPreciseWaiter()
		w.Bind()
		iv := time.Duration(float64(time.Second) / httpRate)
		next := time.Now()
		for i := range n {
			if _, err := w.Wait(ctx, next, nil); err != nil {
				firstErr.CompareAndSwap(nil, &err)
				break
			}
			jobs <- i
			next = next.Add(iv)
			if floor := time.Now().Add(-iv * 9 / 10); floor.After(next) {
				next = floor
			}
		}
		w.Unbind()
		close(jobs)
		wg.Wait()
		return nil
	})
	var err error
	if p := firstErr.Load(); p != nil {
		err = *p
	}
	return int(sent.Load()), m, err
}

// httpDownstream is the downstream process of section 11: this binary again
// with envHTTPDownstream set (serveHTTPDownstream).
type httpDownstream struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	url   string
}

// httpSeen is what the downstream process reports when it stops.
type httpSeen struct {
	at        []time.Time // kernel receive stamps of the requests, sorted
	unstamped int
	conns     int
	cpu       time.Duration // the downstream process's own CPU
}

func startHTTPDownstream() (*httpDownstream, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envHTTPDownstream+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &httpDownstream{cmd: cmd, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<16)}
	line, err := d.out.ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "LISTEN ")
	if err != nil || !ok {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("downstream process did not start: %q %v", line, err)
	}
	d.url = "http://" + addr + "/jobs"
	return d, nil
}

// stop closes the downstream's stdin, reads its report and waits for it.
func (d *httpDownstream) stop() (httpSeen, error) {
	_ = d.stdin.Close()
	var s httpSeen
	for {
		line, err := d.out.ReadString('\n')
		if err != nil {
			_ = d.cmd.Process.Kill()
			_ = d.cmd.Wait()
			return s, fmt.Errorf("downstream process: %v before its report ended", err)
		}
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		x, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "T":
			s.at = append(s.at, time.Unix(0, x))
		case "UNSTAMPED":
			s.unstamped = int(x)
		case "CONNS":
			s.conns = int(x)
		case "CPU":
			s.cpu = time.Duration(x)
		case "END":
			slices.SortFunc(s.at, func(a, b time.Time) int { return a.Compare(b) })
			return s, d.cmd.Wait()
		}
	}
}

// serveHTTPDownstream is the downstream process: a minimal HTTP/1.1 server
// (keep-alive, Content-Length bodies, "200 OK" with a 2-byte body) on a
// kstamp listener, so each request is stamped with the kernel receive time
// of its first byte. It prints "LISTEN <addr>", serves until stdin closes,
// then prints "T <unix ns>" per request, "UNSTAMPED n", "CONNS n", "CPU ns"
// (its own getrusage) and "END". It returns the exit code.
func serveHTTPDownstream(stdin io.Reader, stdout io.Writer) int {
	ln, err := kstamp.Listen("127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench downstream:", err)
		return 1
	}
	var mu sync.Mutex
	var at []int64
	var unstamped, conns int
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns++
			mu.Unlock()
			go serveStamped(c.(*net.TCPConn), func(t time.Time, kernel bool) {
				mu.Lock()
				at = append(at, t.UnixNano())
				if !kernel {
					unstamped++
				}
				mu.Unlock()
			})
		}
	}()
	w := bufio.NewWriterSize(stdout, 1<<16)
	fmt.Fprintf(w, "LISTEN %s\n", ln.Addr())
	_ = w.Flush()
	_, _ = io.Copy(io.Discard, stdin)
	_ = ln.Close()
	mu.Lock()
	for _, t := range at {
		fmt.Fprintf(w, "T %d\n", t)
	}
	fmt.Fprintf(w, "UNSTAMPED %d\nCONNS %d\nCPU %d\nEND\n", unstamped, conns, cpuTime())
	mu.Unlock()
	_ = w.Flush()
	return 0
}

// httpOK is the downstream's answer to every request.
var httpOK = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")

// serveStamped serves one connection: head up to CRLFCRLF, Content-Length
// bytes of body, then httpOK; record gets the stamp of each request's first
// read. An HTTP/1.1 client sends the next request of a connection only after
// the response, so each request line arrives into an empty receive queue and
// its stamp is its own (kstamp).
func serveStamped(c *net.TCPConn, record func(time.Time, bool)) {
	defer c.Close()
	r, err := kstamp.NewReader(c)
	if err != nil {
		return
	}
	var buf []byte
	chunk := make([]byte, 64<<10)
	read := func() bool {
		n, err := r.Read(chunk)
		if err != nil {
			return false
		}
		if len(buf) == 0 {
			record(r.Last(), r.Kernel())
		}
		buf = append(buf, chunk[:n]...)
		return true
	}
	crlf2 := []byte("\r\n\r\n")
	for {
		end := bytes.Index(buf, crlf2)
		if end < 0 {
			if !read() {
				return
			}
			continue
		}
		length := contentLength(buf[:end])
		for len(buf) < end+4+length {
			if !read() {
				return
			}
		}
		if _, err := c.Write(httpOK); err != nil {
			return
		}
		rest := buf[end+4+length:]
		buf = append(buf[:0], rest...)
		if len(buf) > 0 { // pipelined (Go's client does not): stamp it with this read
			record(r.Last(), r.Kernel())
		}
	}
}

// contentLength finds the Content-Length of a request head, 0 when absent.
func contentLength(head []byte) int {
	for _, line := range bytes.Split(head, []byte("\r\n"))[1:] {
		name, value, ok := bytes.Cut(line, []byte(":"))
		if ok && strings.EqualFold(string(bytes.TrimSpace(name)), "content-length") {
			n, _ := strconv.Atoi(string(bytes.TrimSpace(value)))
			return n
		}
	}
	return 0
}

// httpOf returns the row named name.
func (r *Results) httpOf(name string) (httpRow, bool) {
	for _, h := range r.http {
		if h.name == name {
			return h, true
		}
	}
	return httpRow{}, false
}

// httpMarkdown renders section 11.
func (r *Results) httpMarkdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("## 11. HTTP sink at 5,000/s against a bare net/http loop\n\n")
	w("Issue 15: through the HTTP sink at %s/s a lane must deliver within %.1f %% of the limit to an HTTP\n", fmtInt(httpRate), httpMaxErrPct)
	w("downstream in another process, and the CPU the sink path uses per request is set against a bare\n")
	w("`net/http` client loop at the same rate. Each row sends %d requests (%s at %s/s) to a fresh\n", int(httpRate*r.plan.httpCell.Seconds()), fmtSeconds(r.plan.httpCell), fmtInt(httpRate))
	w("downstream process (this binary again: a minimal HTTP/1.1 server answering `200 OK` with a 2-byte body)\n")
	w("that stamps each request with the kernel's receive time of its first byte (SO_TIMESTAMPNS,\n")
	w("internal/kstamp; *unstamped* counts requests the kernel gave no stamp, stamped at the read instead).\n")
	w("*achieved* is (n − 1) / (last − first stamp) at the downstream; the window columns give the most\n")
	w("requests in any closed window of that length, with the G1 bound `floor(W × rate) + 1` (slack 0) in the\n")
	w("header. *CPU* is the sending process's user + system time (getrusage RUSAGE_SELF: every goroutine and\n")
	w("the runtime; the downstream process is not in it) from start to the last answer, divided by requests;\n")
	w("*× bare* compares it with the bare loop's. *conns* is how many TCP connections the downstream accepted\n")
	w("(keep-alive reuse: a paced lane should not dial again). *down CPU* is the downstream process's own.\n")
	w("*longest gap* is the longest silence between two requests at the downstream: a stall of the sender\n")
	w("(or of the machine) shows there first.\n\n")
	w("Contenders:\n\n")
	for _, c := range httpContenders() {
		w("- **%s**: %s\n", c.name, c.what)
	}
	w("\n")
	head := []string{"sender", "requests", "achieved /s", "error %"}
	for _, win := range httpWindows {
		head = append(head, fmt.Sprintf("%s (≤%d)", fmtWindow(win), idealWindow(win, httpRate)))
	}
	head = append(head, "longest gap ms", "CPU µs/req", "× bare", "allocs/req", "conns", "unstamped", "down CPU µs/req", "load %")
	t := table{head: head}
	bare, okBare := r.httpOf("bare net/http loop")
	for _, h := range r.http {
		row := []string{h.name, strconv.Itoa(h.n), fmtRate(h.achieved), fmtPct(h.errPct)}
		for i, n := range h.win {
			switch ideal := idealWindow(httpWindows[i], httpRate); {
			case n < 0, h.downCPU == 0: // too short, or no downstream (the no-op sink)
				row = append(row, "–")
			case n > ideal:
				row = append(row, fmt.Sprintf("%d *", n))
			default:
				row = append(row, strconv.Itoa(n))
			}
		}
		ratio := "–"
		if okBare && bare.cpuPerReq > 0 {
			ratio = fmt.Sprintf("%.2f", float64(h.cpuPerReq)/float64(bare.cpuPerReq))
		}
		conns, unst, down := strconv.Itoa(h.conns), strconv.Itoa(h.unstamped), fmtUs(h.downCPU/time.Duration(max(h.n, 1)))
		if h.downCPU == 0 { // the no-op sink: no downstream
			conns, unst, down = "–", "–", "–"
		}
		row = append(row, fmt.Sprintf("%.2f", h.maxGap.Seconds()*1e3), fmtUs(h.cpuPerReq), ratio, fmt.Sprintf("%.1f", h.allocs), conns, unst, down, fmtLoad(h.load))
		t.add(row...)
	}
	w("%s\n", t.String())
	if lane, ok := r.httpOf("shaper lane, HTTP sink"); ok && len(lane.wire) == len(httpQuantiles) {
		w("The lane's requests from departure to the task's Send call and to the sink's wire report (the\n")
		w("connection's Write returned), in µs. The task is released up to 150 µs before its departure instant\n")
		w("(negative: the Send came before it) and its write waits at the gate until the instant (drain/gate.go),\n")
		w("so the wire report row is the gate's wake-up and the write. The lane holds the next departure until the report, and a report\n")
		w("later than the make-up allows moves the schedule (shaper.Pacer.Wire, SPEC G1 at the wire); the\n")
		w("last row is from one request's wire report to the next departure (negative: it left before the report).\n\n")
		qt := table{head: []string{"departure →", "p50", "p90", "p99", "p99.9"}}
		for _, d := range []struct {
			name string
			q    []time.Duration
		}{{"Send called", lane.start}, {"wire report", lane.wire}, {"(wire report →) next departure", lane.next}} {
			row := []string{d.name}
			for _, q := range d.q {
				row = append(row, fmtUs(q))
			}
			qt.add(row...)
		}
		w("%s\n", qt.String())
		if len(lane.margin) == len(marginWindows) {
			w("How close the downstream came to G1's bound (its kernel stamps): the closest %d requests spanned %s µs\n",
				int(marginWindows[0].Seconds()*httpRate)+2, fmtUs(marginWindows[0]+lane.margin[0]))
			w("(%s µs beyond 10 ms), the closest %d %s µs (%s µs beyond 1 ms); negative: a window broke G1.\n\n",
				fmtUs(lane.margin[0]), int(marginWindows[1].Seconds()*httpRate)+2, fmtUs(marginWindows[1]+lane.margin[1]), fmtUs(lane.margin[1]))
			if o := lane.other; o.OK {
				w("In windows whose length is not a whole number of intervals (bound floor(W × limit / min_spacing) + 1,\n")
				w("W ≥ 1 ms), the closest %d requests spanned %s µs, %s µs beyond the %s µs the bound needs; %d\n",
					o.M+1, fmtUs(o.Span), fmtUs(o.Margin), fmtUs(o.Need), o.Broken)
				w("window(s) broke it (shaper.Pacer's span floor).\n\n")
			}
			if c := lane.closest; c != nil {
				w("The same %d requests spanned %s µs at their departures and %s µs at their wire reports; the wire\n",
					int(marginWindows[0].Seconds()*httpRate)+2, fmtUs(c.departs), fmtUs(c.reports))
				w("report came %s µs after the first one's stamp and %s µs after the last one's (the quickest departure →\n",
					fmtUs(c.firstAfter), fmtUs(c.lastAfter))
				w("wire report of the run: %s µs, of the requests before the window: %s µs; %d request(s) stamped before\n", fmtUs(c.fast), fmtUs(c.fastThen), c.misordered)
				w("their own departure).\n\n")
			}
		}
		if lane.achieved > 0 {
			lost := time.Duration(float64(time.Second)/lane.achieved - float64(time.Second)/httpRate)
			w("Departure → wire: mean %s µs; the mean excess over it, max(delay − mean, 0), is %s µs per request,\n", fmtUs(lane.wireMean), fmtUs(lane.wireExcess))
			w("against %s µs of time lost per request (1/achieved − 1/limit). Above 1,000/s the floor of the next\n", fmtUs(lost))
			w("departure stays at the departures; a request whose wire report is more than an interval behind its\n")
			w("schedule moves the schedule (shaper.Pacer.Wire, the tiles), at most (1 − min_spacing) of an\n")
			w("interval (%s µs) is made up per departure, and the departures from the %dth on after a request keep\n",
				fmtUs(time.Duration((1-shaper.DefaultMinSpacing)*float64(time.Second)/httpRate)),
				int(math.Floor(float64(time.Millisecond)*httpRate/(shaper.DefaultMinSpacing*float64(time.Second))))+1)
			w("k × min_spacing intervals from its wire report (shaper.Pacer.WireFloor, the span floor).\n\n")
			w("The lane's own account (shaper_departure_lateness_forgiven_seconds_total): its schedule gave up\n")
			w("%.1f ms to departures later than the make-up can recover (%.0f requests) and %.1f ms to late wire\n",
				lane.forgivenLate.Seconds()*1e3, lane.forgivenLate.Seconds()*httpRate, lane.forgivenWire.Seconds()*1e3)
			w("reports (%.0f requests), against %.0f requests fewer than the limit over the run.\n\n",
				lane.forgivenWire.Seconds()*httpRate, httpRate*float64(lane.n-1)/lane.achieved+1-float64(lane.n))
		}
	}
	if f, ok := r.httpOf(httpFloorName); ok && f.floor != nil && f.achieved > 0 {
		a := f.floor
		w("The floor row's own account: %d writes returned after the next instant and moved its schedule, by\n", a.moves)
		w("%.1f ms in all: %.1f ms where the waiter returned late, %.1f ms where every connection still waited\n",
			(a.wake+a.conn+a.write).Seconds()*1e3, a.wake.Seconds()*1e3, a.conn.Seconds()*1e3)
		w("for its answer, %.1f ms where the write took long (each move counted under its largest part), against\n", a.write.Seconds()*1e3)
		w("%.0f requests fewer than the limit over the run. It has no client, no lane and one write a request, so\n",
			httpRate*float64(f.n-1)/f.achieved+1-float64(f.n))
		w("what it loses is what the machine took from the process's threads, with nothing of a client or a lane\n")
		w("in it: the lane's row is read against it (docs/performance.md, session 31).\n\n")
	}
	w("Where the lane is behind, docs/performance.md says why, from a profile (`go run ./bench -section http\n")
	w("-cpuprofile FILE`, then `go tool pprof -tagfocus sender=lane-http -top FILE`; the labels are lane-http, bare,\n")
	w("paced, floor and lane-noop, in the order of the rows).\n\n")
	return b.String()
}

// httpHeadlines state section 11 against the bounds.
func (r *Results) httpHeadlines() []string {
	lane, ok1 := r.httpOf("shaper lane, HTTP sink")
	bare, ok2 := r.httpOf("bare net/http loop")
	if !ok1 || !ok2 || lane.n < 2 {
		return nil
	}
	verdict := "within"
	if math.Abs(lane.errPct) > httpMaxErrPct {
		verdict = "OUTSIDE"
	}
	g1 := "within the G1 window bounds"
	for i, n := range lane.win {
		if n > idealWindow(httpWindows[i], httpRate) {
			g1 = fmt.Sprintf("ABOVE the G1 bound in %s windows (%d > %d)", fmtWindow(httpWindows[i]), n, idealWindow(httpWindows[i], httpRate))
			break
		}
	}
	if o := lane.other; o.OK && o.Margin < 0 {
		g1 = fmt.Sprintf("ABOVE the G1 bound in windows of other lengths (%d requests in %s µs, bound %d)", o.M+1, fmtUs(o.Span), o.M)
	}
	ratio := 0.0
	if bare.cpuPerReq > 0 {
		ratio = float64(lane.cpuPerReq) / float64(bare.cpuPerReq)
	}
	paced := ""
	if p, ok := r.httpOf("bare net/http, evenly paced"); ok && p.cpuPerReq > 0 {
		paced = fmt.Sprintf(", and %.2f × the %s µs of the same client paced evenly (%s/s)", float64(lane.cpuPerReq)/float64(p.cpuPerReq), fmtUs(p.cpuPerReq), fmtRate(p.achieved))
	}
	floor := ""
	if f, ok := r.httpOf(httpFloorName); ok && f.n >= 2 {
		fv := "within"
		if math.Abs(f.errPct) > httpMaxErrPct {
			fv = "OUTSIDE"
		}
		floor = fmt.Sprintf(" The floor row (no client, no lane: raw writes on the same waiter) delivered %s/s (%s %%: %s ±%.1f %%).", fmtRate(f.achieved), fmtPct(f.errPct), fv, httpMaxErrPct)
	}
	return []string{fmt.Sprintf("HTTP sink at %s/s to a downstream process: the lane delivered %s/s at the downstream's kernel stamps (%s %%: %s ±%.1f %%), %s; CPU %s µs per request against %s µs for a bare net/http loop at the same rate (%s/s, %s %%): %.2f ×%s; %d connection(s) dialled.%s",
		fmtInt(httpRate), fmtRate(lane.achieved), fmtPct(lane.errPct), verdict, httpMaxErrPct, g1,
		fmtUs(lane.cpuPerReq), fmtUs(bare.cpuPerReq), fmtRate(bare.achieved), fmtPct(bare.errPct), ratio, paced, lane.conns, floor)}
}
