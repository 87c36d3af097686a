package main

// End-to-end tests of the main job (SPEC §1–§3, §5, §6) with real parts: the
// daemon's embedded NATS server with JetStream on a free port and storage
// under t.TempDir(), real HTTP downstreams (httptest.Server), and for the
// signal and demo tests the real binary as a child process. Timing bounds
// have margins: these machines have 2 shared, noisy cores (NOTES.md).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// daemon, embedded NATS server, NATS connection, httptest.Server and child
// process the tests start is stopped by a t.Cleanup. The binary built for
// the child-process tests is removed afterwards.
func TestMain(m *testing.M) {
	// goleak calls the cleanup with the exit code instead of exiting.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { removeShaperBin(); os.Exit(code) }))
}

// TestE2EBurstShapedAt100: a burst of 300 jobs published at once reaches an
// HTTP downstream shaped at 100/s — each exactly once, in publish order, never
// more than 101 in a second nor 2 in 10 ms, and the consumer ends with
// nothing pending (SPEC G1, G3, G4, G8; §6 metrics and readiness).
//
// Arrivals are the kernel's receive timestamps (newStampedDownstream), so the
// bounds judge shaper's spacing at the wire, not the test's own scheduling.
func TestE2EBurstShapedAt100(t *testing.T) {
	down, downURL := newStampedDownstream(t)
	lane := laneSpec{name: "burst", stream: "E2E_BURST", limit: "100/s", capacity: 1000, maxInFlight: 8,
		timeout: "5s", backoff: "[1s, 5s, 30s]", sinkURL: downURL}
	d := startDaemon(t, configYAML("127.0.0.1:0", filepath.Join(t.TempDir(), "nats"), "127.0.0.1:0", "5s", lane))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())

	const n = 300
	keys := publishBurst(t, js, lane.subject(), n)
	down.waitDistinct(t, n, 30*time.Second)

	if code, body, err := httpGet("http://" + d.AdminAddr() + "/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("/readyz while running: code %d, body %q, err %v; want 200", code, strings.TrimSpace(body), err)
	}

	arr, ok := down.snapshot()
	for _, k := range keys {
		if ok[k] != 1 {
			t.Errorf("key %s delivered %d times, want exactly once", k, ok[k])
		}
	}
	if len(arr) != n {
		t.Errorf("downstream saw %d requests, want %d", len(arr), n)
	}
	for i := range min(len(arr), n) {
		if arr[i].key != keys[i] {
			t.Errorf("arrival %d is %s, want %s (publish order)", i, arr[i].key, keys[i])
			break
		}
	}
	ts := times(arr)
	assertRate(t, "1s windows", ts, time.Second, 101)
	assertRate(t, "10ms windows", ts, 10*time.Millisecond, 2)
	span := ts[len(ts)-1].Sub(ts[0])
	if span < 2900*time.Millisecond {
		t.Errorf("first to last arrival took %s; at 100/s 300 arrivals cannot take less than ~2.99s", span)
	}
	n1s, _ := maxInWindow(ts, time.Second)
	n10, _ := maxInWindow(ts, 10*time.Millisecond)
	t.Logf("300 arrivals over %s (%.1f/s); max %d in 1s, %d in 10ms; gaps %s", span.Round(time.Millisecond),
		float64(n-1)/span.Seconds(), n1s, n10, gapSummary(ts))

	waitConsumerSettled(t, js, lane.stream, "shaper-"+lane.name, 5*time.Second)

	samples := scrape(t, d.AdminAddr())
	if v := metricValue(t, samples, "shaper_departures_total", map[string]string{"lane": lane.name}); v != n {
		t.Errorf("shaper_departures_total{lane=%q} = %v, want %d", lane.name, v, n)
	}
}

// TestE2EDrainOnSIGTERM: the binary drains on SIGTERM at the lane's rate,
// exits 0 with a summary line, and hands what is left back so that the next
// start on the same store delivers it (SPEC §3 Drain, G4; NOTES.md: the
// handback must survive the restart of the embedded server).
func TestE2EDrainOnSIGTERM(t *testing.T) {
	bin := buildShaper(t)
	down, downURL := newStampedDownstream(t) // kernel receive timestamps
	const (
		n           = 500
		maxInFlight = 8
	)
	lane := laneSpec{name: "term", stream: "E2E_TERM", limit: "100/s", capacity: 1000, maxInFlight: maxInFlight,
		timeout: "5s", backoff: "[1s, 5s, 30s]", sinkURL: downURL}
	natsAddr, adminAddr := freeAddr(t), freeAddr(t)
	cfgPath := writeFile(t, "config.yaml", configYAML(natsAddr, filepath.Join(t.TempDir(), "nats"), adminAddr, "1s", lane))

	// First run: publish, let it work for ~1.5 s, then SIGTERM.
	first := startChild(t, bin, "run", "-c", cfgPath)
	waitReady(t, adminAddr, 15*time.Second)
	js := connectJS(t, "nats://"+natsAddr)
	keys := publishBurst(t, js, lane.subject(), n)
	time.Sleep(1500 * time.Millisecond)
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	code, exited := first.wait(15 * time.Second)
	if !exited {
		t.Fatalf("no exit within 15s of SIGTERM")
	}
	t.Logf("first run exited %d, %s after SIGTERM", code, time.Since(signalled).Round(time.Millisecond))
	if code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	phase1, ok1 := down.snapshot()
	delivered1 := len(ok1)
	if delivered1 == 0 || delivered1 >= n {
		t.Errorf("first run delivered %d distinct keys; want some but fewer than %d (rate 100/s, ~2.5 s)", delivered1, n)
	}
	if len(phase1) > 0 {
		assertRate(t, "first run incl. drain, 1s windows", times(phase1), time.Second, 101)
	}
	stderr := first.stderrText()
	m := regexp.MustCompile(`msg="shaper stopped" delivered=(\d+) nacked=(\d+) dead_lettered=(\d+) handed_back=(\d+)`).
		FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no summary line `shaper stopped delivered=… nacked=…` in the first run's stderr:\n%s", stderr)
	}
	handedBack, _ := strconv.Atoi(m[4])
	nacked, _ := strconv.Atoi(m[2])
	t.Logf("first run: %d delivered; summary: %s", delivered1, m[0])
	if handedBack+delivered1 != n || nacked < handedBack {
		t.Errorf("first run: %d delivered + %d handed back (nacked %d) != %d published: a message is unaccounted for",
			delivered1, handedBack, nacked, n)
	}

	// Second run on the same store and port: the handed-back rest arrives.
	second := startChild(t, bin, "run", "-c", cfgPath)
	restarted := time.Now()
	if !down.awaitDistinct(n, 20*time.Second) {
		miss := down.missing(keys)
		t.Fatalf("the second run did not deliver the handed-back messages within 20s: %d of %d keys missing: %v",
			len(miss), n, miss)
	}
	t.Logf("second run delivered the rest %d within %s of its start", n-delivered1, time.Since(restarted).Round(time.Millisecond))
	waitReady(t, adminAddr, 5*time.Second)
	js2 := connectJS(t, "nats://"+natsAddr)
	waitConsumerSettled(t, js2, lane.stream, "shaper-"+lane.name, 5*time.Second)
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, exited := second.wait(15 * time.Second); !exited || code != 0 {
		t.Errorf("second run: exited %v with code %d after SIGTERM, want 0", exited, code)
	}

	all, ok := down.snapshot()
	var phase2 []time.Time
	for _, a := range all[len(phase1):] {
		phase2 = append(phase2, a.at)
	}
	if len(phase2) > 0 {
		assertRate(t, "second run, 1s windows", phase2, time.Second, 101)
	}
	dups := 0
	for _, k := range keys {
		switch c := ok[k]; {
		case c == 0:
			t.Errorf("key %s never delivered", k)
		case c > 1:
			dups += c - 1
		}
	}
	t.Logf("duplicates across the restart: %d (at most max_in_flight %d allowed)", dups, maxInFlight)
	if dups > maxInFlight {
		t.Errorf("%d duplicate deliveries; only the ≤ %d tasks in flight at SIGTERM may repeat", dups, maxInFlight)
	}
}

// TestE2EHangingSinkTimesOut: one sink call that hangs is cut by the task
// timeout and retried; meanwhile the cadence holds (SPEC G5, §3 per-task
// timeout and retries).
func TestE2EHangingSinkTimesOut(t *testing.T) {
	const (
		n       = 40
		hangKey = "msg-0003"
	)
	down := newDownstream(t, func(key string, attempt int) bool { return key == hangKey && attempt == 1 })
	lane := laneSpec{name: "hang", stream: "E2E_HANG", limit: "20/s", capacity: 1000, maxInFlight: 4,
		timeout: "300ms", backoff: "[500ms]", sinkURL: down.url()}
	d := startDaemon(t, configYAML("127.0.0.1:0", filepath.Join(t.TempDir(), "nats"), "127.0.0.1:0", "5s", lane))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	keys := publishBurst(t, js, lane.subject(), n)
	down.waitDistinct(t, n, 20*time.Second)

	arr, ok := down.snapshot()
	assertRate(t, "all arrivals, 1s windows", times(arr), time.Second, 21)
	var others []time.Time
	for _, a := range arr {
		if a.key != hangKey {
			others = append(others, a.at)
		}
	}
	if len(others) != n-1 {
		t.Errorf("%d arrivals of the other keys, want %d", len(others), n-1)
	}
	if len(others) > 1 {
		// 38 intervals of 50 ms, plus the departures of msg-0003 (hang and
		// retry) in between: ~2.0 s. A hang that stalled departures would
		// add at least its 300 ms timeout.
		// The largest gap between consecutive arrivals: 50 ms nominal; a
		// departure held by the hang would leave a gap of about the task
		// timeout (300 ms).
		all := times(arr)
		var maxGap time.Duration
		for i := 1; i < len(all); i++ {
			maxGap = max(maxGap, all[i].Sub(all[i-1]))
		}
		if maxGap >= 200*time.Millisecond {
			t.Errorf("a gap of %s between consecutive arrivals (nominal 50ms): the hang held departures", maxGap)
		}
		span := others[len(others)-1].Sub(others[0])
		t.Logf("the other %d keys arrived over %s; largest gap %s", len(others), span.Round(time.Millisecond), maxGap.Round(time.Microsecond))
		if span > 2400*time.Millisecond {
			t.Errorf("the other keys took %s from first to last arrival, want ≤ 2.4s: the hang stalled departures", span)
		}
	}
	for _, k := range keys {
		if ok[k] != 1 {
			t.Errorf("key %s answered 204 %d times, want 1", k, ok[k])
		}
	}
	if a := down.attemptsOf(hangKey); a != 2 {
		t.Errorf("%s reached the downstream %d times, want 2 (hang, then the retry)", hangKey, a)
	}
	waitConsumerSettled(t, js, lane.stream, "shaper-"+lane.name, 5*time.Second)
	samples := scrape(t, d.AdminAddr())
	if v := metricValue(t, samples, "shaper_task_duration_seconds_count",
		map[string]string{"lane": lane.name, "outcome": "timeout"}); v < 1 {
		t.Errorf("shaper_task_duration_seconds_count{outcome=\"timeout\"} = %v, want ≥ 1", v)
	}
}

// TestRunInvalidConfigExits2: `run` and `validate` reject an invalid config
// with exit code 2, naming the key, before starting anything (SPEC §4, §5).
func TestRunInvalidConfigExits2(t *testing.T) {
	// lane renders a config whose payments lane has the given rate and task
	// lines; %[1]s is the admin address, %[2]s the store dir.
	const base = `
nats:
  url: ""
  embedded: { listen: "127.0.0.1:0", store_dir: %[2]q }
admin: { listen: %[1]q }
downstreams:
  payments:
    source: { stream: CALLBACKS, subjects: [callbacks.payments.>] }
    bucket: { capacity: %[3]s }
    rate: { %[4]s }
    task: { timeout: %[5]s }
    sink: { kind: log }
`
	tests := []struct {
		name                         string
		capacity, rate, timeout, key string
	}{
		{"missing rate.limit", "1000", "slack: 0", "5s", "downstreams.payments.rate.limit"},
		{"negative capacity", "-5", "limit: 100/s", "5s", "downstreams.payments.bucket.capacity"},
		{"unknown key", "1000", "limit: 100/s, limt: 100/s", "5s", "downstreams.payments.rate.limt"},
		{"bare number duration", "1000", "limit: 100/s", "5", "downstreams.payments.task.timeout"},
		{"unparsable duration", "1000", "limit: 100/s", `"fast"`, "downstreams.payments.task.timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, cmd := range []string{"run", "validate"} {
				admin := freeAddr(t)
				store := filepath.Join(t.TempDir(), "nats")
				path := writeFile(t, "config.yaml", fmt.Sprintf(base, admin, store, tt.capacity, tt.rate, tt.timeout))
				var out, errb bytes.Buffer
				done := make(chan int, 1)
				go func() { done <- run([]string{cmd, "-c", path}, &out, &errb) }()
				var code int
				select {
				case code = <-done:
				case <-time.After(10 * time.Second):
					t.Fatalf("%s did not return within 10s: it started the daemon", cmd)
				}
				if code != exitUsage {
					t.Errorf("%s: exit code %d, want 2; stdout %q, stderr %q", cmd, code, out.String(), errb.String())
				}
				if !strings.Contains(errb.String(), tt.key+":") {
					t.Errorf("%s: stderr does not name %q:\n%s", cmd, tt.key, errb.String())
				}
				ln, err := net.Listen("tcp", admin)
				if err != nil {
					t.Errorf("%s: admin address %s not free afterwards: %v", cmd, admin, err)
				} else {
					_ = ln.Close()
				}
				if _, err := os.Stat(store); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: NATS store dir %s exists afterwards (err %v): something was started", cmd, store, err)
				}
			}
		})
	}
	t.Run("problems before warnings", func(t *testing.T) {
		// An invalid file with a warning too: the header and the problems
		// come first, the warnings after them under their own heading (a
		// new-user pass read a warning printed above the header as the
		// reason). Capacity 1000 at 1/s is the G7 warning.
		store := filepath.Join(t.TempDir(), "nats")
		path := writeFile(t, "config.yaml", fmt.Sprintf(base, freeAddr(t), store, "1000", "limit: 1/s", "5s")+"    sink_typo: 1\n")
		var out, errb bytes.Buffer
		if code := run([]string{"validate", "-c", path}, &out, &errb); code != exitUsage {
			t.Fatalf("exit code %d, want 2; stderr:\n%s", code, errb.String())
		}
		text := errb.String()
		head, warn, probl := strings.Index(text, "invalid configuration:"), strings.Index(text, "warnings:"), strings.Index(text, "sink_typo")
		if head != 0 || probl < head || warn < probl || !strings.Contains(text[warn:], "source.ack_wait") {
			t.Errorf("stderr:\n%s\nwant the header first, then the problems, then \"warnings:\" and the G7 warning", text)
		}
	})
	t.Run("valid", func(t *testing.T) {
		store := filepath.Join(t.TempDir(), "nats")
		path := writeFile(t, "config.yaml", fmt.Sprintf(base, freeAddr(t), store, "1000", "limit: 100/s", "5s"))
		var out, errb bytes.Buffer
		if code := run([]string{"validate", "-c", path}, &out, &errb); code != exitOK {
			t.Errorf("validate of a good config: exit code %d, want 0; stderr:\n%s", code, errb.String())
		}
		if !strings.Contains(out.String(), "configuration valid") {
			t.Errorf("validate stdout = %q, want it to say the configuration is valid", out.String())
		}
	})
}

// TestDemoRunsClean: `shaper demo` shapes a burst and a trickle into its rigid
// downstream with nothing lost and no 429 (SPEC §5). The demo starts its
// downstream as a child of its own executable, so it runs as the built binary.
// It gets a second try on failure, reported in the log. The burst keeps a
// backlog for 10 s, the window of SPEC G1's long-run rate that the demo's
// 99.5 % rule judges: with a burst of 300 (3.4 s of backlog) one CI run
// failed both attempts at 98.8 and 99.4 %, 17 ms of lateness being 0.5 % of
// that span (and 50 ms of 10 s).
func TestDemoRunsClean(t *testing.T) {
	bin := buildShaper(t)
	const attempts = 2
	failures := 0
	for i := 1; i <= attempts; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		start := time.Now()
		out, err := exec.CommandContext(ctx, bin, "demo", "--burst", "1000", "--trickle-rate", "20", "--trickle-for", "2s").CombinedOutput()
		cancel()
		text := string(out)
		if err == nil && strings.Contains(text, "result: OK") && strings.Contains(text, "429s 0") {
			t.Logf("demo attempt %d passed in %s (%d earlier failures)", i, time.Since(start).Round(time.Millisecond), failures)
			return
		}
		failures++
		t.Logf("DEMO ATTEMPT %d FAILED (err %v) after %s:\n%s", i, err, time.Since(start).Round(time.Millisecond), text)
	}
	t.Fatalf("demo failed %d of %d attempts", failures, attempts)
}
