package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/simulate"
)

// TestE2ESimulateMatchesDaemon keeps `shaper simulate` honest: one trace (a
// burst of 60, then 10/s for 6 s, on a lane at 20/s: a backlog that drains
// while the trickle goes on, then departures that follow the arrivals) runs
// through the daemon, judged at kernel receive timestamps, and through
// simulate.Run with the daemon's own lane configuration. The k-th departure
// of each, counted from the first, differ by less than one interval.
func TestE2ESimulateMatchesDaemon(t *testing.T) {
	var csv strings.Builder
	for range 60 {
		csv.WriteString("0\n")
	}
	for i := 1; i <= 60; i++ {
		fmt.Fprintf(&csv, "%.1f\n", float64(i)/10)
	}
	trace, err := simulate.ReadTrace(strings.NewReader(csv.String()))
	if err != nil {
		t.Fatal(err)
	}

	down, downURL := newStampedDownstream(t)
	lane := laneSpec{name: "sim", stream: "E2E_SIM", limit: "20/s", capacity: 1000, maxInFlight: 8,
		timeout: "5s", backoff: "[1s, 5s, 30s]", sinkURL: downURL}
	d := startDaemon(t, configYAML("127.0.0.1:0", filepath.Join(t.TempDir(), "nats"), "127.0.0.1:0", "5s", lane))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())

	start := time.Now()
	for i, a := range trace {
		time.Sleep(time.Until(start.Add(a.At)))
		publishKeyed(t, js, lane.subject(), "m", i, 1)
	}
	down.waitDistinct(t, len(trace), 20*time.Second)
	arr, _ := down.snapshot()
	d.stop(5 * time.Second)

	res := simulate.Run(d.cfg.Downstreams["sim"], trace, simulate.Options{})
	if len(res.Departures) != len(trace) || len(arr) != len(trace) {
		t.Fatalf("simulate departed %d, the daemon delivered %d; want %d each", len(res.Departures), len(arr), len(trace))
	}
	interval := 50 * time.Millisecond
	worst, at := time.Duration(0), 0
	for k := range arr {
		daemon := arr[k].at.Sub(arr[0].at)
		sim := res.Departures[k].At - res.Departures[0].At
		if diff := (daemon - sim).Abs(); diff > worst {
			worst, at = diff, k
		}
	}
	t.Logf("largest difference %v at departure %d (daemon %v, simulate %v after the first)", worst, at,
		arr[at].at.Sub(arr[0].at).Round(time.Millisecond), res.Departures[at].At-res.Departures[0].At)
	if worst >= interval {
		t.Errorf("departure %d: daemon and simulate differ by %v, want under one interval (%v)", at, worst, interval)
	}
}

// TestSimulateCommand: the command prints the table and the summary, writes
// the SVG, runs without the sink's secrets (a warning each), and exits 2 on
// bad usage or an unknown lane.
func TestSimulateCommand(t *testing.T) {
	cfg := writeFile(t, "config.yaml", `
downstreams:
  p:
    source: { stream: S, subjects: ["a.>"] }
    bucket: { capacity: 100, overflow: reject, fair_key: "subject:1" }
    rate: { limit: 10/s }
    sink: { kind: log }
`)
	trace := writeFile(t, "trace.csv", "time_offset_seconds,key\n0,a\n0,a\n0,b\n0.5,b\n")
	svg := filepath.Join(t.TempDir(), "out.svg")
	var out, errb strings.Builder
	if code := run([]string{"simulate", "-c", cfg, "--lane", "p", "--trace", trace, "--svg", svg}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"fair_key subject:1", "p99 queue wait", "summary: arrived 4, delivered 4, dead letters 0", "worst 1 s window", "wrote " + svg} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if b, err := os.ReadFile(svg); err != nil || !strings.HasPrefix(string(b), "<svg") {
		t.Errorf("svg: %v", err)
	}
	// The sink's secrets need not be set: simulate reaches no downstream.
	secret := writeFile(t, "secret.yaml", `
downstreams:
  p:
    source: { stream: S, subjects: ["a.>"] }
    rate: { limit: 10/s }
    sink: { kind: http, url: "${SHAPERTEST_SIM_UNSET_URL}", headers: { authorization: "Bearer ${SHAPERTEST_SIM_UNSET_TOKEN}" } }
`)
	out.Reset()
	errb.Reset()
	if code := run([]string{"simulate", "-c", secret, "--lane", "P", "--burst", "5"}, &out, &errb); code != exitOK { // lane names are lower-cased
		t.Errorf("simulate with unset sink secrets: exit %d: %s", code, errb.String())
	} else if !strings.Contains(errb.String(), "${SHAPERTEST_SIM_UNSET_TOKEN} is not set") || !strings.Contains(out.String(), "delivered 5") {
		t.Errorf("simulate with unset sink secrets: stderr %q, stdout %q", errb.String(), out.String())
	}
	// Nor its files: a production config names credentials, TLS and token
	// files that a laptop does not have.
	files := writeFile(t, "files.yaml", `
nats: { url: "nats://prod:4222", creds: /nonexistent/shaper.creds, tls: { ca_file: /nonexistent/ca.pem } }
downstreams:
  p:
    source: { stream: S, subjects: ["a.>"] }
    rate: { limit: 10/s }
    sink: { kind: http, url: "https://pay.example/cb", tls: { ca_file: /nonexistent/pay-ca.pem }, auth: { kind: bearer_file, path: /nonexistent/token } }
`)
	out.Reset()
	errb.Reset()
	if code := run([]string{"simulate", "-c", files, "--lane", "p", "--burst", "5"}, &out, &errb); code != exitOK {
		t.Errorf("simulate with missing credentials, TLS and token files: exit %d: %s", code, errb.String())
	} else {
		for _, key := range []string{"nats.creds", "nats.tls.ca_file", "downstreams.p.sink.tls.ca_file", "downstreams.p.sink.auth.path"} {
			if !strings.Contains(errb.String(), key) {
				t.Errorf("simulate with missing files: no warning for %s in %q", key, errb.String())
			}
		}
		if !strings.Contains(out.String(), "delivered 5") {
			t.Errorf("simulate with missing files: stdout %q", out.String())
		}
	}
	if code := run([]string{"validate", "-c", files}, &out, &errb); code != exitUsage {
		t.Errorf("validate with missing files: exit %d, want 2 (only simulate lets them be)", code)
	}
	errb.Reset()
	if code := run([]string{"simulate", "-c", cfg, "--lane", "p", "--burst", "5", "--svg", "/nonexistent/x.svg"}, &out, &errb); code != exitFailure ||
		!strings.Contains(errb.String(), "simulate: --svg: open /nonexistent/x.svg") {
		t.Errorf("simulate with an unwritable --svg: exit %d, stderr %q; want 1 and the flag named", code, errb.String())
	}
	// Only the simulated lane's warnings are printed (and those of no lane).
	two := writeFile(t, "two.yaml", `
downstreams:
  quiet:
    source: { stream: Q, subjects: ["q.>"] }
    rate: { limit: 10/s }
    sink: { kind: log }
  warned:
    source: { stream: W, subjects: ["w.>"], ack_wait: 1s }
    rate: { limit: 10/s }
    sink: { kind: log }
`)
	for lane, want := range map[string]bool{"quiet": false, "Warned": true} {
		errb.Reset()
		if code := run([]string{"simulate", "-c", two, "--lane", lane, "--burst", "3"}, &out, &errb); code != exitOK {
			t.Errorf("simulate --lane %s: exit %d: %s", lane, code, errb.String())
		} else if got := strings.Contains(errb.String(), "downstreams.warned.source.ack_wait: warning"); got != want {
			t.Errorf("simulate --lane %s: the other lane's warning printed %v, want %v: %q", lane, got, want, errb.String())
		}
	}
	// A trickle alone is a trace too (a new-user pass found it refused).
	out.Reset()
	if code := run([]string{"simulate", "-c", cfg, "--lane", "p", "--trickle", "5", "--for", "2s"}, &out, &errb); code != exitOK ||
		!strings.Contains(out.String(), "; 5/s for 2s\n") || !strings.Contains(out.String(), "summary: arrived 10, delivered 10") {
		t.Errorf("simulate --trickle 5 --for 2s: exit %d, stdout %q", code, out.String())
	}
	for _, args := range [][]string{
		{"simulate", "-c", cfg, "--lane", "nope", "--burst", "5"},
		{"simulate", "-c", cfg, "--lane", "p", "--trickle", "0.1", "--for", "2s"}, // no arrival within 2 s
		{"simulate", "-c", cfg, "--lane", "p", "--trickle", "5", "--for", "2s", "--trace", trace},
		{"simulate", "-c", cfg, "--lane", "p"},
		{"simulate", "-c", cfg, "--lane", "p", "--burst", "5", "--trace", trace},
		{"simulate", "-c", cfg, "--lane", "p", "--burst", "5", "--trickle", "3"},
		{"simulate", "-c", cfg, "--lane", "p", "--trace", cfg + ".missing"},
	} {
		if code := run(args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want 2", args[3:], code)
		}
	}
}
