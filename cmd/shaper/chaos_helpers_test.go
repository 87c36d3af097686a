package main

// The harness of the chaos suite (chaos_test.go, issue 4): a NATS server in
// a process of its own that a test can stop and start again on the same
// port and store (testserver.NATSProcess), the shaper binary as a child
// process (so that signals are real), a downstream that records every request, and the ledger that
// accounts for every published message at the end.
//
// It reuses the end-to-end helpers of e2e_helpers_test.go: buildShaper,
// startChild, freeAddr, writeFile, waitReady, httpGet, scrape, metricValue,
// maxInWindow.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/daemon"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/internal/testserver"
)

// connectChaos connects the test's own client to url, reconnecting forever
// (the server may restart); a cleanup closes the connection.
func connectChaos(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("chaos-test"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// ---------------------------------------------------------------------------
// The downstream.

// Downstream behaviours the tests switch between.
const (
	answerOK   int32 = iota // 204
	answerHang              // no response until the client gives up
	answer500               // 500 Internal Server Error
)

// request is one request the downstream saw.
type request struct {
	key      string    // Idempotency-Key
	bodyID   string    // the id in the payload: the message the request is about
	delivery int       // X-Shaper-Delivery: the server's delivery count
	at       time.Time // kernel receive timestamp of the request's first byte
	handled  time.Time // when the handler began (diagnostics only: late by scheduling)
	end      time.Time // when the handler answered, or saw the client go away
	status   int       // 0: no response (hung until the client went away)
}

// chaosDownstream records every request and answers as the test says:
// answerOK, answerHang or answer500 for everyone, except that reject(key)
// true answers 400 (a permanent failure: dead letter rejected_by_sink).
type chaosDownstream struct {
	srv     *httptest.Server // stamped (newStampedServer)
	answer  atomic.Int32
	latency time.Duration // before a 204
	reject  func(key string) bool
	active  atomic.Int64 // requests being answered now

	mu   sync.Mutex
	reqs []request
	ok   map[string]int // key -> 2xx answers
}

func newChaosDownstream(t *testing.T, latency time.Duration, reject func(string) bool) *chaosDownstream {
	t.Helper()
	d := &chaosDownstream{latency: latency, reject: reject, ok: map[string]int{}}
	d.srv = newStampedServer(t, d.serveHTTP)
	return d
}

func (d *chaosDownstream) url() string { return d.srv.URL + "/callback" }

func (d *chaosDownstream) serveHTTP(w http.ResponseWriter, r *http.Request, at time.Time) {
	d.active.Add(1)
	defer d.active.Add(-1)
	rq := request{at: at, handled: time.Now(), key: r.Header.Get("Idempotency-Key")}
	rq.delivery, _ = strconv.Atoi(r.Header.Get("X-Shaper-Delivery"))
	var body struct {
		ID string `json:"id"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	rq.bodyID = body.ID
	switch {
	case d.reject != nil && d.reject(rq.key):
		rq.status = http.StatusBadRequest
	case d.answer.Load() == answerHang:
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute): // never reached: the task timeout is shorter
		}
	case d.answer.Load() == answer500:
		rq.status = http.StatusInternalServerError
	default:
		if d.latency > 0 {
			time.Sleep(d.latency)
		}
		rq.status = http.StatusNoContent
	}
	rq.end = time.Now()
	d.mu.Lock()
	d.reqs = append(d.reqs, rq)
	if rq.status/100 == 2 {
		d.ok[rq.key]++
	}
	d.mu.Unlock()
	if rq.status != 0 {
		w.WriteHeader(rq.status)
	}
}

// requests returns the requests so far in arrival order.
func (d *chaosDownstream) requests() []request {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := slices.Clone(d.reqs)
	slices.SortStableFunc(r, func(x, y request) int { return x.at.Compare(y.at) })
	return r
}

// delivered returns how many distinct keys were answered 2xx.
func (d *chaosDownstream) delivered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ok)
}

// awaitDelivered waits until n distinct keys were answered 2xx and reports
// whether that happened within timeout.
func (d *chaosDownstream) awaitDelivered(n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for d.delivered() < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// attemptsByKey returns each key's requests in arrival order.
func attemptsByKey(reqs []request) map[string][]request {
	out := map[string][]request{}
	for _, r := range reqs {
		out[r.key] = append(out[r.key], r)
	}
	return out
}

// ---------------------------------------------------------------------------
// The rig: one scenario's NATS server, downstream, config and shaper runs.

// chaosLane holds the lane keys a scenario sets (SPEC §4).
type chaosLane struct {
	limit        float64 // per second
	capacity     int
	maxInFlight  int
	ackWait      string
	timeout      string
	backoff      string // YAML list
	maxDeliver   int
	drainTimeout string
}

const (
	chaosLaneName = "chaos"
	chaosStream   = "CHAOS"
	chaosSubject  = "chaos.jobs.new"
	chaosConsumer = "shaper-" + chaosLaneName
)

// chaosConfig renders the config of a shaper connected to the external
// server natsURL with one lane delivering to sinkURL.
func chaosConfig(natsURL, adminListen, sinkURL string, l chaosLane) string {
	return fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
log: { level: info, format: text }
shutdown: { drain_timeout: %s }
downstreams:
  %s:
    source: { stream: %s, subjects: ["chaos.jobs.>"], ack_wait: %s, max_deliver: %d }
    bucket: { capacity: %d, overflow: block }
    rate: { limit: %g/s }
    task: { timeout: %s, max_in_flight: %d, retry: { backoff: %s } }
    sink: { kind: http, url: %q, method: POST, success_status: [2xx] }
`, natsURL, adminListen, l.drainTimeout, chaosLaneName, chaosStream, l.ackWait, l.maxDeliver,
		l.capacity, l.limit, l.timeout, l.maxInFlight, l.backoff, sinkURL)
}

// chaosRig is one scenario: its own NATS server process and store, stream,
// downstream, admin address and config; shaper runs start from it.
type chaosRig struct {
	t       *testing.T
	bin     string
	lane    chaosLane
	nats    *testserver.NATSProcess
	nc      *nats.Conn
	js      jetstream.JetStream
	down    *chaosDownstream
	admin   string
	cfgPath string
	keys    []string
	began   time.Time
}

// newChaosRig builds the binary (once per test run), starts the NATS server
// process and creates the lane's stream, so that the scenario can publish
// before or after shaper starts.
func newChaosRig(t *testing.T, lane chaosLane, down *chaosDownstream) *chaosRig {
	t.Helper()
	r := &chaosRig{t: t, bin: buildShaper(t), lane: lane, down: down, began: time.Now()}
	r.nats = testserver.StartNATSProcess(t)
	r.nc, r.js = connectChaos(t, r.nats.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: chaosStream, Subjects: []string{"chaos.jobs.>"},
		Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	r.admin = freeAddr(t)
	r.cfgPath = writeFile(t, "config.yaml", chaosConfig(r.nats.URL(), r.admin, down.url(), lane))
	return r
}

// startShaper starts `shaper run` as a child process and waits for /readyz.
func (r *chaosRig) startShaper() *child {
	r.t.Helper()
	c := startChild(r.t, r.bin, "run", "-c", r.cfgPath)
	waitReady(r.t, r.admin, 20*time.Second)
	return c
}

// publish publishes n jobs with ids <prefix>-00000… (Nats-Msg-Id, and so the
// Idempotency-Key; also in the payload) and waits for every publish ack.
func (r *chaosRig) publish(prefix string, n int) []string {
	r.t.Helper()
	keys := make([]string, 0, n)
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		id := fmt.Sprintf("%s-%05d", prefix, i)
		msg := &nats.Msg{Subject: chaosSubject, Header: nats.Header{}, Data: fmt.Appendf(nil, `{"id":%q}`, id)}
		msg.Header.Set(jetstream.MsgIDHeader, id)
		f, err := r.js.PublishMsgAsync(msg)
		if err != nil {
			r.t.Fatalf("publish %s: %v", id, err)
		}
		futures = append(futures, f)
		keys = append(keys, id)
	}
	timeout := time.After(20 * time.Second)
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			r.t.Fatalf("publish %s: %v", keys[i], err)
		case <-timeout:
			r.t.Fatalf("publish acks: timed out at %d of %d", i, n)
		}
	}
	r.keys = append(r.keys, keys...)
	return keys
}

// consumerInfo returns the lane's consumer info.
func (r *chaosRig) consumerInfo() (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := r.js.Consumer(ctx, chaosStream, chaosConsumer)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// waitSettled waits until the consumer has nothing pending nor
// unacknowledged, or fails the test.
func (r *chaosRig) waitSettled(timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		info, err := r.consumerInfo()
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("NumPending %d, NumAckPending %d, NumRedelivered %d", info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		if time.Now().After(deadline) {
			r.t.Errorf("consumer not settled after %s: %s", timeout, last)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitAll waits until every published key was answered 2xx or is in the
// dead-letter stream, or fails the test naming what is missing.
func (r *chaosRig) awaitAll(timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done := r.down.delivered()
		if done >= len(r.keys) {
			return
		}
		dead := r.deadLetters()
		ok := attemptsByKey(r.down.requests())
		var missing []string
		for _, k := range r.keys {
			if _, d := dead[k]; d {
				continue
			}
			if !slices.ContainsFunc(ok[k], func(q request) bool { return q.status/100 == 2 }) {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("after %s, %d of %d messages neither delivered nor dead-lettered, e.g. %v",
				timeout, len(missing), len(r.keys), missing[:min(len(missing), 20)])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deadLetter is one copy in the dead-letter stream.
type deadLetter struct {
	reason string // Shaper-Reason
	copies int
}

// deadLetters reads the lane's dead letters (subject shaper.dead.<lane> of
// stream SHAPER_DEAD) by idempotency key (their Shaper-Key header).
func (r *chaosRig) deadLetters() map[string]*deadLetter {
	out := map[string]*deadLetter{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := r.js.Stream(ctx, daemon.DeadStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out
	}
	if err != nil {
		r.t.Fatalf("dead-letter stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		r.t.Fatalf("dead-letter stream info: %v", err)
	}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			r.t.Fatalf("dead-letter stream message %d: %v", seq, err)
		}
		if m.Subject != "shaper.dead."+chaosLaneName {
			continue
		}
		key := m.Header.Get(drain.HeaderKey)
		dl := out[key]
		if dl == nil {
			dl = &deadLetter{reason: m.Header.Get(drain.HeaderReason)}
			out[key] = dl
		}
		dl.copies++
	}
	return out
}

// metrics scrapes the shaper's /metrics.
func (r *chaosRig) metrics() []sample {
	r.t.Helper()
	return scrape(r.t, r.admin)
}

// laneMetric returns name{lane, extra...} (extra: label, value pairs).
func laneMetric(t *testing.T, samples []sample, name string, extra ...string) float64 {
	t.Helper()
	labels := map[string]string{"lane": chaosLaneName}
	for i := 0; i+1 < len(extra); i += 2 {
		labels[extra[i]] = extra[i+1]
	}
	return metricValue(t, samples, name, labels)
}

// laneMetricSum returns the sum of every series of name for the lane.
func laneMetricSum(samples []sample, name string) float64 {
	var sum float64
	for _, s := range samples {
		if s.name == name && s.labels["lane"] == chaosLaneName {
			sum += s.value
		}
	}
	return sum
}

// signalChild sends sig to a shaper child.
func signalChild(t *testing.T, c *child, sig os.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// stopShaper sends SIGTERM and expects exit code 0 within timeout.
func stopShaper(t *testing.T, c *child, timeout time.Duration) {
	t.Helper()
	signalChild(t, c, syscall.SIGTERM)
	code, exited := c.wait(timeout)
	if !exited {
		t.Fatalf("shaper did not exit within %s of SIGTERM", timeout)
	}
	if code != 0 {
		t.Errorf("shaper exited %d after SIGTERM, want 0", code)
	}
}

// drainSummary is the summary line a drain ends with (SPEC §3, Drain).
type drainSummary struct{ delivered, nacked, deadLettered, handedBack int }

var summaryRE = regexp.MustCompile(`msg="shaper stopped" delivered=(\d+) nacked=(\d+) dead_lettered=(\d+) handed_back=(\d+)`)

// summaryOf parses the summary line of a stopped shaper child's stderr.
func summaryOf(t *testing.T, c *child) drainSummary {
	t.Helper()
	m := summaryRE.FindStringSubmatch(c.stderrText())
	if m == nil {
		t.Fatalf("no `shaper stopped delivered=… handed_back=…` summary line in the shaper's stderr")
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	return drainSummary{delivered: n(1), nacked: n(2), deadLettered: n(3), handedBack: n(4)}
}

// ---------------------------------------------------------------------------
// The ledger.

// ledger is the reconciliation of one scenario.
type ledger struct {
	published, delivered, deadLettered, duplicates, requests int
	dupKeys                                                  []string
	maxPerSecond, bound                                      int
	lag                                                      string // handler start after arrival
}

func (l ledger) String() string {
	return fmt.Sprintf("published %d, delivered %d, dead-lettered %d, duplicates %d, downstream requests %d, max %d requests in a 1s window (bound %d) at kernel receive times; handler lag %s",
		l.published, l.delivered, l.deadLettered, l.duplicates, l.requests, l.maxPerSecond, l.bound, l.lag)
}

// reconcile accounts for every published message (SPEC G4): delivered (a
// 2xx answer) or in the dead-letter stream with a Shaper-Reason, never
// both, none missing; at most allowDup duplicate deliveries, each carrying
// the message's own Idempotency-Key; and the rate bound (G1) in every 1 s
// window of downstream arrivals across all shaper runs of the scenario.
func (r *chaosRig) reconcile(allowDup int) ledger {
	t := r.t
	t.Helper()
	reqs := r.down.requests()
	dead := r.deadLetters()
	byKey := attemptsByKey(reqs)
	published := make(map[string]bool, len(r.keys))
	for _, k := range r.keys {
		published[k] = true
	}
	l := ledger{published: len(r.keys), requests: len(reqs)}
	var missing, both []string
	for _, k := range r.keys {
		ok := 0
		for _, q := range byKey[k] {
			if q.status/100 == 2 {
				ok++
			}
		}
		dl := dead[k]
		switch {
		case ok > 0 && dl != nil:
			both = append(both, k)
		case ok == 0 && dl == nil:
			missing = append(missing, k)
		}
		if ok > 0 {
			l.delivered++
		}
		if ok > 1 {
			l.duplicates += ok - 1
			l.dupKeys = append(l.dupKeys, k)
		}
		if dl != nil {
			l.deadLettered++
			if dl.reason == "" {
				t.Errorf("ledger: dead letter of %s has no %s header", k, drain.HeaderReason)
			}
			if dl.copies > 1 {
				t.Errorf("ledger: %s is %d times in the dead-letter stream", k, dl.copies)
			}
		}
	}
	for k, dl := range dead {
		if !published[k] {
			t.Errorf("ledger: dead letter %q (reason %s) was never published", k, dl.reason)
		}
	}
	for _, q := range reqs {
		switch {
		case !published[q.key]:
			t.Errorf("ledger: the downstream got Idempotency-Key %q, which was never published", q.key)
		case q.bodyID != q.key:
			t.Errorf("ledger: a request for message %q carried Idempotency-Key %q", q.bodyID, q.key)
		}
	}
	if len(missing) > 0 {
		t.Errorf("ledger: %d messages LOST (neither delivered nor dead-lettered), e.g. %v", len(missing), missing[:min(20, len(missing))])
	}
	if len(both) > 0 {
		t.Errorf("ledger: %d messages both delivered and dead-lettered, e.g. %v", len(both), both[:min(20, len(both))])
	}
	if l.duplicates > allowDup {
		t.Errorf("ledger: %d duplicate deliveries (keys %v); this fault allows at most %d", l.duplicates, l.dupKeys[:min(20, len(l.dupKeys))], allowDup)
	}
	// G1 at the downstream (SPEC: the bounds hold for what reaches it):
	// requests per 1 s window ≤ floor(limit) + 1 (slack 0), at the kernel's
	// receive timestamps (newStampedServer), across all shaper runs.
	l.bound = int(math.Floor(r.lane.limit)) + 1
	if len(reqs) > 0 {
		ts := make([]time.Time, len(reqs))
		for i, q := range reqs {
			ts[i] = q.at
		}
		var at time.Time
		l.maxPerSecond, at = maxInWindow(ts, time.Second)
		assertRate(t, "ledger: G1 at the downstream, 1s windows", ts, time.Second, l.bound)
		if l.maxPerSecond > l.bound {
			// Which requests came closer than min_spacing (0.95) intervals.
			tight := time.Duration(0.95 * float64(time.Second) / r.lane.limit)
			var pairs []string
			for i := 1; i < len(reqs); i++ {
				q, p := reqs[i], reqs[i-1]
				if q.at.Before(at) || !q.at.Before(at.Add(time.Second)) || q.at.Sub(p.at) >= tight {
					continue
				}
				pairs = append(pairs, fmt.Sprintf("%s(+%s, lag %s) after %s", q.key, q.at.Sub(p.at).Round(time.Microsecond),
					q.handled.Sub(q.at).Round(time.Microsecond), p.key))
			}
			t.Logf("ledger: in that window %d requests came less than 0.95 intervals after the one before: %v", len(pairs), pairs)
		}
		l.lag = handlerLag(reqs)
	}
	t.Logf("LEDGER %s: %s; scenario took %s", t.Name(), l, time.Since(r.began).Round(100*time.Millisecond))
	return l
}

// handlerLag describes how long after its arrival each request's handler
// began: p50, p99 and max. It is what handler timestamps would have added.
func handlerLag(reqs []request) string {
	lags := make([]time.Duration, len(reqs))
	for i, q := range reqs {
		lags[i] = q.handled.Sub(q.at)
	}
	slices.Sort(lags)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("p50 %s, p99 %s, max %s", r(lags[len(lags)/2]), r(lags[len(lags)*99/100]), r(lags[len(lags)-1]))
}

// checkDeliveryCounts asserts that, for every key, the server's delivery
// counts seen at the downstream (X-Shaper-Delivery) are exactly 1, 2, …, k in
// arrival order: every delivery by the server became one attempt, so the
// server never redelivered a message on its own (ack wait) while shaper held
// it (SPEC G7). It returns the number of retries this implies (Σ k−1).
func checkDeliveryCounts(t *testing.T, reqs []request) int {
	t.Helper()
	retries, bad := 0, 0
	for key, rs := range attemptsByKey(reqs) {
		for i, q := range rs {
			if q.delivery != i+1 {
				if bad < 10 {
					t.Errorf("%s: attempt %d carried delivery count %d (all: %v): the server redelivered it on its own",
						key, i+1, q.delivery, deliveryCounts(rs))
				}
				bad++
				break
			}
		}
		retries += len(rs) - 1
	}
	if bad > 0 {
		t.Errorf("%d keys show a server-side redelivery", bad)
	}
	return retries
}

func deliveryCounts(rs []request) []int {
	out := make([]int, len(rs))
	for i, q := range rs {
		out[i] = q.delivery
	}
	return out
}

// statusCounts counts the downstream's answers by status (0 = none).
func statusCounts(reqs []request) map[int]int {
	out := map[int]int{}
	for _, q := range reqs {
		out[q.status]++
	}
	return out
}

// readiness polls /readyz every 20 ms in the background and records each
// change of its answer.
type readiness struct {
	mu      sync.Mutex
	changes []readyChange
	stop    chan struct{}
	done    chan struct{}
}

type readyChange struct {
	at    time.Time
	ready bool
	body  string
}

func watchReadiness(t *testing.T, admin string) *readiness {
	rd := &readiness{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(rd.done)
		for {
			code, body, err := httpGet("http://" + admin + "/readyz")
			ready := err == nil && code == http.StatusOK
			rd.mu.Lock()
			if n := len(rd.changes); n == 0 || rd.changes[n-1].ready != ready {
				if err != nil {
					body = err.Error()
				}
				rd.changes = append(rd.changes, readyChange{at: time.Now(), ready: ready, body: strings.TrimSpace(body)})
			}
			rd.mu.Unlock()
			select {
			case <-rd.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(rd.close)
	return rd
}

func (rd *readiness) close() {
	select {
	case <-rd.stop:
	default:
		close(rd.stop)
	}
	<-rd.done
}

// firstChange returns the first recorded change to ready at or after from.
func (rd *readiness) firstChange(from time.Time, ready bool) (readyChange, bool) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, c := range rd.changes {
		if c.ready == ready && !c.at.Before(from) {
			return c, true
		}
	}
	return readyChange{}, false
}

// awaitChange waits up to timeout for a change to ready at or after from.
func (rd *readiness) awaitChange(from time.Time, ready bool, timeout time.Duration) (readyChange, bool) {
	deadline := time.Now().Add(timeout)
	for {
		if c, ok := rd.firstChange(from, ready); ok {
			return c, true
		}
		if time.Now().After(deadline) {
			return readyChange{}, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
