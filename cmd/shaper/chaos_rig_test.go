package main

// The rig of the chaos suite (chaos_test.go, issue 4): one scenario's NATS
// server in a process of its own that a test can stop and start again on the
// same port and store (testserver.NATSProcess), its downstream
// (chaos_downstream_test.go), config, and the shaper binary as a child
// process (so that signals are real). The ledger that accounts for every
// published message at the end is in chaos_ledger_test.go, the readiness
// watch in chaos_readiness_test.go.
//
// It reuses the end-to-end helpers (e2e_*_test.go): buildShaper,
// startChild, freeAddr, writeFile, waitReady, httpGet, scrape, metricValue,
// maxInWindow.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
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
