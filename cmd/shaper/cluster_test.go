package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// clusterTests gates the tests that start a 3-node nats-server cluster and
// run for about a minute each (.ci/run sets it).
func clusterTests(t *testing.T) {
	t.Helper()
	if os.Getenv("SHAPERTEST_CLUSTER") != "1" {
		t.Skip("a 3-node nats-server cluster for about a minute: set SHAPERTEST_CLUSTER=1 (.ci/run does)")
	}
}

// steadyPublisher publishes job i every interval to subject with
// Nats-Msg-Id msgKey(i), retrying each publish until the cluster acks it
// (the stream's duplicate window drops a retried publish the stream kept),
// so that a leader change or a killed node loses no job.
type steadyPublisher struct {
	keys []string
	mu   sync.Mutex
	stop chan struct{}
	done chan struct{}
	errs atomic.Int64
}

func startSteadyPublisher(t *testing.T, js jetstream.JetStream, subject string, first, interval time.Duration, burst int) *steadyPublisher {
	t.Helper()
	p := &steadyPublisher{stop: make(chan struct{}), done: make(chan struct{})}
	publish := func(i int) {
		msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: fmt.Appendf(nil, `{"seq":%d}`, i)}
		msg.Header.Set(jetstream.MsgIDHeader, msgKey(i))
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := js.PublishMsg(ctx, msg)
			cancel()
			if err == nil {
				break
			}
			p.errs.Add(1)
			select {
			case <-p.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		p.mu.Lock()
		p.keys = append(p.keys, msgKey(i))
		p.mu.Unlock()
	}
	go func() {
		defer close(p.done)
		i := 0
		for ; i < burst; i++ {
			publish(i)
		}
		next := time.Now().Add(first)
		for {
			select {
			case <-p.stop:
				return
			case <-time.After(time.Until(next)):
			}
			publish(i)
			i++
			next = next.Add(interval)
			if late := time.Until(next); late < -time.Second {
				next = time.Now() // a publish blocked by an election: no catch-up burst
			}
		}
	}()
	return p
}

func (p *steadyPublisher) halt() []string {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.keys)
}

// jsAPI sends a JetStream API request and fails on an error reply.
func jsAPI(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	resp, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	var r struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil || r.Error != nil {
		t.Fatalf("%s: %s (%v)", subject, resp.Data, err)
	}
}

// leaders returns the current leaders of the stream and of the consumer ("" while
// there is none or the cluster does not answer).
func leaders(js jetstream.JetStream, stream, consumer string) (string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var sl, cl string
	if s, err := js.Stream(ctx, stream); err == nil && s.CachedInfo().Cluster != nil {
		sl = s.CachedInfo().Cluster.Leader
	}
	if c, err := js.Consumer(ctx, stream, consumer); err == nil && c.CachedInfo().Cluster != nil {
		cl = c.CachedInfo().Cluster.Leader
	}
	return sl, cl
}

// readyWithin polls /readyz until it answers 200 and returns how long that
// took from since, or fails after timeout.
func readyWithin(t *testing.T, addr string, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	for {
		code, body, err := httpGet("http://" + addr + "/readyz")
		if err == nil && code == http.StatusOK {
			return time.Since(since)
		}
		if time.Since(since) > timeout {
			t.Errorf("/readyz not 200 %s after the event: %d %q %v", timeout, code, body, err)
			return time.Since(since)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// largestGap returns the largest gap between consecutive arrivals (sorted)
// among those that span any instant of [from, to], and where it starts.
func largestGap(ts []time.Time, from, to time.Time) (time.Duration, time.Time) {
	var gap time.Duration
	var at time.Time
	for i := 1; i < len(ts); i++ {
		if ts[i].Before(from) || ts[i-1].After(to) {
			continue
		}
		if g := ts[i].Sub(ts[i-1]); g > gap {
			gap, at = g, ts[i-1]
		}
	}
	return gap, at
}

// TestClusterFailover (issue 13): a lane at 25/s on an R3 stream of a
// 3-node cluster of real nats-server processes, under steady input. The
// consumer leader steps down, then the stream leader, then the consumer
// leader's node is killed with SIGKILL and restarted. The downstream
// (kernel receive timestamps) never waits more than 2 s around a step-down,
// nor more than 6 s (or the server's election, when longer) around the
// kill, and gets the next job within 2 s of a live leader; no 1 s window holds more than 26;
// every job is delivered, duplicates are few and carry the job's key; and
// /readyz is 200 again within 3 s of each event (of the new leader, for the
// kill).
func TestClusterFailover(t *testing.T) {
	clusterTests(t)
	c := testserver.StartCluster(t, 3)
	down, sinkURL := newStampedDownstream(t)
	admin := freeAddr(t)
	const stream, consumer = "CLU", "shaper-clu"
	td := startDaemon(t, fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
log: { level: debug }
downstreams:
  clu:
    source: { stream: %s, subjects: [clu.>], replicas: 3, ack_wait: 30s }
    bucket: { capacity: 50 }
    rate: { limit: 25/s }
    task: { timeout: 2s, max_in_flight: 4 }
    sink: { kind: http, url: %q }
`, c.URLs(), admin, stream, sinkURL))
	waitReady(t, admin, 10*time.Second)

	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := js.Stream(context.Background(), stream); err != nil || s.CachedInfo().Config.Replicas != 3 {
		t.Fatalf("stream %s: %v; want R3 (source.replicas 3)", stream, err)
	}
	if cc, err := js.Consumer(context.Background(), stream, consumer); err != nil || cc.CachedInfo().Cluster == nil || len(cc.CachedInfo().Cluster.Replicas) != 2 {
		t.Fatalf("consumer %s: %v; want R3 (2 peers besides the leader)", consumer, err)
	}

	for _, name := range []string{"SHAPER_DEAD", "KV_SHAPER_CONTROL"} {
		if s, err := js.Stream(context.Background(), name); err != nil || s.CachedInfo().Config.Replicas != 3 {
			t.Errorf("stream %s: %v; want R3 (the largest source.replicas)", name, err)
		}
	}

	// 25/s in, after a backlog of 60: the bucket holds 2 s of work, the
	// stream 10 more. A consumer leader election after a kill takes 4.4–7.3 s
	// here (NOTES.md); the bucket covers 2 s of it (docs/scaling.md sizing).
	pub := startSteadyPublisher(t, js, "clu.job", 0, 40*time.Millisecond, 60)
	time.Sleep(5 * time.Second)

	type event struct {
		name    string
		at      time.Time // the step-down, or the kill
		leader  time.Time // a live consumer leader named again
		maxGap  time.Duration
		ready   time.Duration
		bound   time.Duration
		gapFrom time.Time
	}
	var events []*event
	ev := func(name string) *event {
		e := &event{name: name, at: time.Now()}
		events = append(events, e)
		return e
	}
	waitLeader := func(e *event, not string) {
		for {
			sl, cl := leaders(js, stream, consumer)
			if cl != "" && cl != not && sl != "" {
				e.leader = time.Now()
				return
			}
			if time.Since(e.at) > 30*time.Second {
				t.Fatalf("%s: no consumer leader 30 s later", e.name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	_, cl0 := leaders(js, stream, consumer)
	e := ev("consumer leader step-down (" + cl0 + ")")
	jsAPI(t, nc, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer)
	waitLeader(e, cl0)
	e.ready = readyWithin(t, admin, e.at, 3*time.Second)
	time.Sleep(6 * time.Second)

	sl0, _ := leaders(js, stream, consumer)
	e = ev("stream leader step-down (" + sl0 + ")")
	jsAPI(t, nc, "$JS.API.STREAM.LEADER.STEPDOWN."+stream)
	waitLeader(e, "")
	e.ready = readyWithin(t, admin, e.at, 3*time.Second)
	time.Sleep(6 * time.Second)

	_, cl1 := leaders(js, stream, consumer)
	victim := c.NodeByName(cl1)
	if victim == nil {
		t.Fatalf("consumer leader %q is no node of the cluster", cl1)
	}
	connected := td.NATSURL()
	e = ev("kill -9 of the consumer leader's node (" + cl1 + ")")
	c.Kill(victim)
	waitLeader(e, cl1)
	e.ready = readyWithin(t, admin, e.leader, 3*time.Second)
	if now := td.NATSURL(); connected == victim.URL() && (now == victim.URL() || now == "") {
		t.Errorf("the daemon was connected to the killed node %s and is now on %q; want another node", connected, now)
	} else {
		t.Logf("the daemon was connected to %s (the killed node is %s), now to %s", connected, victim.URL(), now)
	}
	time.Sleep(4 * time.Second)
	restart := ev("restart of " + cl1)
	c.Restart(victim)
	restart.leader = time.Now()
	restart.ready = readyWithin(t, admin, restart.leader, 3*time.Second)
	time.Sleep(5 * time.Second)

	haltAt := time.Now() // after it, the gaps are the end of the input
	keys := pub.halt()
	if !down.awaitDistinct(len(keys), 60*time.Second) {
		t.Errorf("delivered %d distinct of %d; missing %v", down.distinctDelivered(), len(keys), down.missing(keys))
	}
	waitConsumerSettled(t, js, stream, consumer, 30*time.Second)
	td.stop(10 * time.Second)

	arr, ok := down.snapshot()
	ts := times(arr)
	assertRate(t, "cluster failover", ts, time.Second, 26)
	dups := 0
	for _, k := range keys {
		if ok[k] > 1 {
			dups += ok[k] - 1
		}
	}
	for k := range ok {
		if !slices.Contains(keys, k) {
			t.Errorf("delivered key %q that was never published", k)
		}
	}
	for i, e := range events {
		end := haltAt
		if i+1 < len(events) {
			end = events[i+1].at
		}
		e.maxGap, e.gapFrom = largestGap(ts, e.at, end)
		bound := 2 * time.Second
		if e.name[:4] == "kill" {
			// The gap after a kill holds nats-server's election, which
			// shaper does not control (4.4–7.3 s here, 8.4 s in one CI run
			// on a loaded machine, where the gap was 6.19 s and the lane
			// resumed 643 ms before the test saw the leader). So 6 s, or
			// the election when it took longer; shaper's own part, resuming
			// within 2 s of a live leader, is asserted below either way.
			bound = max(6*time.Second, e.leader.Sub(e.at))
		}
		t.Logf("%s: largest gap %s (starting %s after the event, ending %s after the leader was named), leader named after %s, /readyz 200 after %s (from the event; for the kill, from the new leader)",
			e.name, e.maxGap.Round(time.Millisecond), e.gapFrom.Sub(e.at).Round(time.Millisecond),
			e.gapFrom.Add(e.maxGap).Sub(e.leader).Round(time.Millisecond),
			e.leader.Sub(e.at).Round(time.Millisecond), e.ready.Round(time.Millisecond))
		if e.maxGap > bound {
			t.Errorf("%s: largest gap at the downstream %s; want ≤ %s", e.name, e.maxGap, bound)
		}
		// However long the election after the kill, the lane resumes within
		// the step-down bound once a live leader is named.
		if resumed := e.gapFrom.Add(e.maxGap).Sub(e.leader); e.name[:4] == "kill" && resumed > 2*time.Second {
			t.Errorf("%s: the downstream got the next job %s after the new leader was named; want ≤ 2s", e.name, resumed)
		}
	}
	n, _ := maxInWindow(ts, time.Second)
	t.Logf("published %d, delivered %d (%d duplicates, all with the job's key), max in 1 s %d, publish retries %d, gaps %s",
		len(keys), len(arr), dups, n, pub.errs.Load(), gapSummary(ts))
	// The acks lost with the killed leader's consumer state come back
	// after ack_wait: at most what was unacknowledged then, max_ack_pending
	// (capacity 50 + max_in_flight 4), with the job's key (G8).
	if dups > 54 {
		t.Errorf("%d duplicates; want at most max_ack_pending (54), the messages unacknowledged at the kill", dups)
	}
}
