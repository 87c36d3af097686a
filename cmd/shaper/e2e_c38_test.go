//go:build linux

package main

// Field case C38 (large payloads: the client's pending buffer, a byte budget,
// and the one message bigger than the budget) end to end, with the case's
// numbers: a nats-server process with JetStream (testserver.NATSProcess,
// default max_payload 1 MiB), the shaper binary as a child process
// (chaosRig), and an HTTP downstream on loopback that reads every body and
// stamps arrivals with the kernel's receive time (newChaosDownstream). The
// shaper's CPU time and peak RSS are read from /proc/<pid>.
//
// t is seconds since the daemon reported ready (the case's convention): the
// messages are published before the shaper starts, so the whole input is in
// the stream at t = 0, and t = 0 is when this test saw /readyz answer 200
// (at most one 50 ms poll after the daemon turned ready), or the first
// arrival at the downstream when that came earlier (c38Start).

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// c38Payload returns a JSON payload of exactly size bytes that carries id
// (the chaos downstream decodes it, and so reads the whole body).
func c38Payload(id string, size int) []byte {
	head := fmt.Appendf(nil, `{"id":%q,"pad":"`, id)
	const tail = `"}`
	b := make([]byte, 0, size)
	b = append(b, head...)
	b = append(b, bytes.Repeat([]byte{'x'}, size-len(head)-len(tail))...)
	return append(b, tail...)
}

// publishSized publishes one job per entry of sizes, job i with id
// <prefix>-<i> (Nats-Msg-Id, so the Idempotency-Key, and in the payload)
// and a payload of sizes[i] bytes, in order, at most 16 unacknowledged at
// once (so that this process does not buffer 200 MiB), and waits for every
// publish ack. The keys join r.keys for the ledger.
func publishSized(r *chaosRig, prefix string, sizes []int) []string {
	r.t.Helper()
	const window = 16
	keys := make([]string, 0, len(sizes))
	var futures []jetstream.PubAckFuture
	wait := func() {
		timeout := time.After(30 * time.Second)
		for i, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				r.t.Fatalf("publish %s: %v", f.Msg().Header.Get(jetstream.MsgIDHeader), err)
			case <-timeout:
				r.t.Fatalf("publish acks: timed out at %d of a window of %d", i, len(futures))
			}
		}
		futures = futures[:0]
	}
	for i, size := range sizes {
		id := fmt.Sprintf("%s-%05d", prefix, i)
		msg := &nats.Msg{Subject: chaosSubject, Header: nats.Header{}, Data: c38Payload(id, size)}
		msg.Header.Set(jetstream.MsgIDHeader, id)
		f, err := r.js.PublishMsgAsync(msg)
		if err != nil {
			r.t.Fatalf("publish %s (%d bytes): %v", id, size, err)
		}
		futures = append(futures, f)
		keys = append(keys, id)
		if len(futures) == window {
			wait()
		}
	}
	wait()
	r.keys = append(r.keys, keys...)
	return keys
}

// procCPU returns the CPU time (user + system, all threads) the process pid
// used so far, from fields 14 and 15 of /proc/<pid>/stat, in clock ticks of
// USER_HZ, which is 100 on Linux.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count the fields after its closing one, from field 3 (state).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks int64
	for _, x := range f[11:13] { // fields 14 (utime) and 15 (stime)
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	const userHZ = 100
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// procStatusBytes returns the value of key (e.g. VmHWM, VmRSS) in
// /proc/<pid>/status, in bytes.
func procStatusBytes(pid int, key string) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != key {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status %s: %w", pid, key, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, key)
}

// every calls f every d in a goroutine until the returned stop is called
// (also by a cleanup); stop returns once f is no longer running.
func every(t *testing.T, d time.Duration, f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			f()
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() { close(quit) })
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// c38Stderr fails the test when the shaper's log reports a slow consumer
// (messages dropped by nats.go's pending limits), a missed heartbeat (a
// pull that never completes, the 409 loop of nats.go#1718), a NATS
// disconnection (nats-server closes a slow consumer's connection) or any
// asynchronous NATS error.
func c38Stderr(t *testing.T, c *child) {
	t.Helper()
	log := strings.ToLower(c.stderrText())
	for _, bad := range []string{"slow consumer", "no heartbeat", "nats disconnected", "nats asynchronous error"} {
		if n := strings.Count(log, bad); n > 0 {
			t.Errorf("the shaper's log says %q %d times; want 0", bad, n)
		}
	}
}

// c38Ok returns the requests of reqs answered 2xx.
func c38Ok(reqs []request) []request {
	return slices.DeleteFunc(slices.Clone(reqs), func(q request) bool { return q.status/100 != 2 })
}

// c38Start is t = 0 of a run: when this test saw /readyz answer 200
// (ready), or the first arrival at the downstream when that came earlier:
// the daemon turned ready before either.
func c38Start(ready time.Time, ok []request) time.Time {
	if len(ok) > 0 && ok[0].at.Before(ready) {
		return ok[0].at
	}
	return ready
}

// c38LastAnswer returns when the last of reqs was answered.
func c38LastAnswer(reqs []request) time.Time {
	var last time.Time
	for _, q := range reqs {
		if q.end.After(last) {
			last = q.end
		}
	}
	return last
}

// c38Redelivered returns the consumer's NumRedelivered once it settled.
func c38Redelivered(r *chaosRig) int {
	r.t.Helper()
	r.waitSettled(10 * time.Second)
	info, err := r.consumerInfo()
	if err != nil {
		r.t.Fatalf("consumer info: %v", err)
	}
	return info.NumRedelivered
}

// TestCase_C38_RunB_MessageBiggerThanBudget is field case C38, run B: 50
// messages of 1 KiB, one of 1,000,000 bytes (under nats-server's default
// max_payload of 1 MiB, checked first), 50 of 1 KiB, all in the stream at
// t = 0; lane at rate.limit 20/s, bucket.capacity 20, every other key at
// its default (no source.max_message_bytes: the big message must be
// delivered, not dead-lettered). A shaper whose pulls carry a byte budget
// smaller than the message would get 409 "Message Size Exceeds MaxBytes"
// for every pull and loop (nats.go#1718). It asserts:
//   - the 1 MB message is delivered (2xx) exactly once, in its place (right
//     after message 49, right before message 51), and answered within 1 s
//     of its turn: its turn is one interval (50 ms) after message 49
//     reached the downstream;
//   - all 101 are handled (answered 2xx) by t = 8 s;
//   - no gap between consecutive arrivals at the downstream exceeds 1.0 s;
//   - the shaper process averages < 0.5 core (its utime + stime from
//     /proc/<pid>/stat) from ready until the last delivery;
//   - 0 "no heartbeat" (nor slow-consumer, disconnection or asynchronous
//     NATS errors) in the shaper's log;
//   - the ledger: every message delivered, none lost, none twice, ≤ 21
//     arrivals in every 1 s window (G1 at the kernel's receive stamps);
//     every request is the message's first delivery and the consumer's
//     NumRedelivered is 0.
func TestCase_C38_RunB_MessageBiggerThanBudget(t *testing.T) {
	const (
		limit   = 20.0
		small   = 1 << 10
		big     = 1_000_000
		turnMax = time.Second
	)
	interval := time.Duration(float64(time.Second) / limit)
	down := newChaosDownstream(t, 0, nil)
	r := newChaosRig(t, chaosLane{limit: limit, capacity: 20, maxInFlight: 8, ackWait: "60s", timeout: "5s",
		backoff: "[1s, 5s, 30s]", maxDeliver: 5, drainTimeout: "5s"}, down)
	// The server's max_payload bounds headers and payload; leave 4 KiB for
	// the headers (Nats-Msg-Id).
	if mp := r.nc.MaxPayload(); mp < big+4<<10 {
		t.Fatalf("nats-server max_payload is %d bytes: it would refuse the case's %d-byte message", mp, big)
	}
	sizes := make([]int, 0, 101)
	for range 50 {
		sizes = append(sizes, small)
	}
	sizes = append(sizes, big)
	for range 50 {
		sizes = append(sizes, small)
	}
	keys := publishSized(r, "c38b", sizes)
	bigKey := keys[50]

	started := time.Now()
	c := r.startShaper()
	t0 := time.Now()
	pid := c.cmd.Process.Pid
	cpu0, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	if !down.awaitDelivered(len(keys), 15*time.Second) {
		r.awaitAll(time.Second) // fails naming what is missing
	}
	done := time.Now()
	cpu1, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ready %s after start; %d delivered %s after ready", t0.Sub(started).Round(time.Millisecond), len(keys), done.Sub(t0).Round(time.Millisecond))

	reqs := down.requests()
	ok := c38Ok(reqs)
	// The 1 MB message, delivered within 1 s of its turn, in its place.
	bi := slices.IndexFunc(ok, func(q request) bool { return q.key == bigKey })
	switch {
	case bi < 0:
		t.Errorf("the %d-byte message %s was not delivered (dead letters: %v)", big, bigKey, r.deadLetters()[bigKey])
	case bi == 0 || bi == len(ok)-1:
		t.Errorf("the %d-byte message %s arrived at position %d of %d: out of its place", big, bigKey, bi, len(ok))
	default:
		prev, bq, next := ok[bi-1], ok[bi], ok[bi+1]
		if prev.key != keys[49] || next.key != keys[51] {
			t.Errorf("the %d-byte message arrived after %s and before %s; want after %s and before %s (G3 order)",
				big, prev.key, next.key, keys[49], keys[51])
		}
		turn := prev.at.Add(interval)
		late := bq.end.Sub(turn)
		t.Logf("the %d-byte message: arrived %s after its turn, answered %s after it (%s after the one before), the next arrived %s after it",
			big, bq.at.Sub(turn).Round(time.Millisecond), late.Round(time.Millisecond),
			bq.at.Sub(prev.at).Round(time.Millisecond), next.at.Sub(bq.at).Round(time.Millisecond))
		if late > turnMax {
			t.Errorf("the %d-byte message was delivered %s after its turn (one interval after message 49 arrived); want ≤ %s",
				big, late.Round(time.Millisecond), turnMax)
		}
	}
	// All 101 handled by t = 8, counted from ready or from the first
	// arrival, whichever came first (a lane may deliver before this test's
	// poll sees /readyz).
	if at := c38LastAnswer(ok).Sub(c38Start(t0, ok)); at > 8*time.Second {
		t.Errorf("the last of %d messages was answered at t = %.2f s; want all handled by t = 8 s", len(keys), at.Seconds())
	} else {
		t.Logf("all %d answered by t = %.2f s (first arrival %.3f s after ready was seen)", len(keys), at.Seconds(), ok[0].at.Sub(t0).Seconds())
	}
	// No gap over 1.0 s.
	ts := make([]time.Time, len(ok))
	for i, q := range ok {
		ts[i] = q.at
	}
	if gap, at := largestGap(ts, ts[0], ts[len(ts)-1]); gap > time.Second {
		t.Errorf("a gap of %s between arrivals at the downstream, from t = %.2f s; want ≤ 1.0 s", gap.Round(time.Millisecond), at.Sub(t0).Seconds())
	}
	t.Logf("gaps between arrivals: %s", gapSummary(ts))
	// < 0.5 core on average.
	wall := done.Sub(t0)
	used := cpu1 - cpu0
	if cores := used.Seconds() / wall.Seconds(); cores >= 0.5 {
		t.Errorf("the shaper used %s of CPU in %s from ready to the last delivery: %.2f core; want < 0.5", used, wall.Round(time.Millisecond), cores)
	} else {
		t.Logf("the shaper used %s of CPU in %s: %.3f core (%s since its start)", used, wall.Round(time.Millisecond), cores, cpu1)
	}
	if n := c38Redelivered(r); n != 0 {
		t.Errorf("consumer NumRedelivered %d; want 0", n)
	}
	for _, q := range reqs {
		if q.delivery != 1 {
			t.Errorf("%s reached the downstream at delivery %d; want every request to be the first delivery", q.key, q.delivery)
		}
	}
	stopShaper(t, c, 15*time.Second)
	c38Stderr(t, c)
	r.reconcile(0)
}

// TestCase_C38_RunA_LargePayloadsBoundedMemory is field case C38, run A: 400
// messages of 512 KiB (200 MiB) in a file-storage stream at t = 0; lane at
// bucket.capacity 100, task.max_in_flight 4, rate.limit 20/s,
// source.ack_wait 30s; the downstream reads each body and answers 2xx after
// 5 ms. Fetching by count alone (nats.go Consume's 500 ahead) would hold
// ~250 MiB more than the bucket and hit the client's 64 MiB pending limit
// (slow consumer, dropped messages redelivered after ack_wait). It asserts:
//   - all 400 are delivered (2xx), each exactly once, by t = 22 s, with no
//     other request (every request is its message's first delivery);
//   - the consumer's NumRedelivered is 0 once settled;
//   - no "slow consumer" in the shaper's log (nor a NATS disconnection, by
//     which nats-server drops a slow consumer, nor an asynchronous NATS
//     error): the server's varz slow_consumers is not read, the test
//     server has no monitoring port;
//   - shaper_bucket_depth_messages ≤ 100 at every scrape (every 200 ms);
//   - the shaper's peak RSS (VmHWM of /proc/<pid>/status, or the largest
//     VmRSS sampled every 200 ms if larger) ≤ 250 MiB;
//   - the ledger: none lost, none twice, ≤ 21 arrivals in every 1 s window.
//
// About 22 s of wall clock and 200 MiB written to the store: behind
// needCluster.
func TestCase_C38_RunA_LargePayloadsBoundedMemory(t *testing.T) {
	needCluster(t)
	const (
		n        = 400
		size     = 512 << 10
		capacity = 100
		by       = 22 * time.Second
		maxRSS   = 250 << 20
	)
	down := newChaosDownstream(t, 5*time.Millisecond, nil)
	r := newChaosRig(t, chaosLane{limit: 20, capacity: capacity, maxInFlight: 4, ackWait: "30s", timeout: "5s",
		backoff: "[1s, 5s, 30s]", maxDeliver: 5, drainTimeout: "5s"}, down)
	sizes := make([]int, n)
	for i := range sizes {
		sizes[i] = size
	}
	pubStart := time.Now()
	keys := publishSized(r, "c38a", sizes)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := r.js.Stream(ctx, chaosStream)
	if err != nil {
		t.Fatal(err)
	}
	si, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if si.Config.Storage != jetstream.FileStorage || si.State.Msgs != n || si.State.Bytes < n*size {
		t.Fatalf("stream %s: storage %v, %d messages, %d bytes; want file storage, %d messages of %d bytes",
			chaosStream, si.Config.Storage, si.State.Msgs, si.State.Bytes, n, size)
	}
	t.Logf("published %d × %d bytes (%d MiB in the stream) in %s", n, size, si.State.Bytes>>20, time.Since(pubStart).Round(time.Millisecond))

	c := r.startShaper()
	t0 := time.Now()
	pid := c.cmd.Process.Pid
	var (
		mu                    sync.Mutex
		scrapes, scrapeErrors int
		maxDepth              float64
		overDepth             []string
		maxRSSSeen            uint64
	)
	stop := every(t, 200*time.Millisecond, func() {
		rss, _ := procStatusBytes(pid, "VmRSS")
		code, body, err := httpGet("http://" + r.admin + "/metrics")
		var samples []sample
		if err == nil && code == 200 {
			samples, err = parseMetrics(body)
		}
		mu.Lock()
		defer mu.Unlock()
		maxRSSSeen = max(maxRSSSeen, rss)
		if err != nil || code != 200 {
			scrapeErrors++
			return
		}
		for _, x := range samples {
			if x.name == "shaper_bucket_depth_messages" && x.labels["lane"] == chaosLaneName {
				scrapes++
				maxDepth = max(maxDepth, x.value)
				if x.value > capacity {
					overDepth = append(overDepth, fmt.Sprintf("%v at t = %.1f s", x.value, time.Since(t0).Seconds()))
				}
			}
		}
	})
	if !down.awaitDelivered(n, 40*time.Second) {
		r.awaitAll(time.Second) // fails naming what is missing
	}
	stop()
	hwm, err := procStatusBytes(pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}

	reqs := down.requests()
	ok := c38Ok(reqs)
	if at := c38LastAnswer(ok).Sub(c38Start(t0, ok)); at > by {
		t.Errorf("the last of %d messages was answered at t = %.2f s; want all delivered by t = %.0f s", n, at.Seconds(), by.Seconds())
	} else {
		t.Logf("all %d answered by t = %.2f s (first arrival %.3f s after ready was seen)", n, at.Seconds(), ok[0].at.Sub(t0).Seconds())
	}
	if len(reqs) != n {
		t.Errorf("the downstream got %d requests for %d messages; want each exactly once", len(reqs), n)
	}
	for _, q := range reqs {
		if q.delivery != 1 {
			t.Errorf("%s reached the downstream at delivery %d; want every request to be the first delivery", q.key, q.delivery)
		}
	}
	if got := c38Redelivered(r); got != 0 {
		t.Errorf("consumer NumRedelivered %d; want 0", got)
	}
	mu.Lock()
	t.Logf("%d scrapes (%d failed), largest bucket depth %v; peak RSS %.1f MiB (largest sampled VmRSS %.1f MiB)",
		scrapes, scrapeErrors, maxDepth, float64(hwm)/(1<<20), float64(maxRSSSeen)/(1<<20))
	if len(overDepth) > 0 {
		t.Errorf("shaper_bucket_depth_messages above the capacity %d in %d scrapes: %v", capacity, len(overDepth), overDepth[:min(10, len(overDepth))])
	}
	if scrapes < 50 {
		t.Errorf("only %d scrapes of /metrics saw the bucket depth (%d failed); want one every 200 ms of the run", scrapes, scrapeErrors)
	}
	mu.Unlock()
	// VmHWM is updated lazily by the kernel: take the larger of it and
	// the sampled VmRSS.
	if peak := max(hwm, maxRSSSeen); peak > maxRSS {
		t.Errorf("the shaper's peak RSS (VmHWM) is %.1f MiB; want ≤ %d MiB", float64(peak)/(1<<20), maxRSS>>20)
	}
	stopShaper(t, c, 15*time.Second)
	c38Stderr(t, c)
	if l := r.reconcile(0); l.delivered != len(keys) {
		t.Errorf("%d of %d delivered", l.delivered, len(keys))
	}
}
