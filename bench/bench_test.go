package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain also serves as section 11's downstream process and as section
// 5's large-payload cells: the harness re-executes its own binary, which
// under `go test` is this one.
func TestMain(m *testing.M) {
	if os.Getenv(envHTTPDownstream) == "1" {
		os.Exit(serveHTTPDownstream(os.Stdin, os.Stdout))
	}
	if span := os.Getenv(envStallProbe); span != "" {
		os.Exit(stallChild(span, os.Stdout))
	}
	if len(os.Args) == 3 && os.Args[1] == "-large-child" {
		os.Exit(largeChild(os.Args[2], os.Stdout))
	}
	goleak.VerifyTestMain(m)
}

// TestBenchQuick runs `go run ./bench -quick` so that CI notices when the
// harness rots (an API it uses changed, a contender stopped delivering, a
// consumer kept messages unacked). It checks the report's shape, not the
// numbers: CI machines are shared and the race detector slows everything.
func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the quick benchmark (about 30 s)")
	}
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-quick", "-out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("bench -quick exited %d:\n%s", code, stderr.String())
	}
	written, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(written, stdout.Bytes()) {
		t.Error("the report written differs from the one printed")
	}
	md := string(written)
	for _, want := range []string{
		"# Benchmarks", "go run ./bench -quick", "## Headlines",
		"## 1. Pacing precision", "### 100/s", "### 1,000/s", "### 10,000/s", "### 50,000/s",
		"## 2. Strict judge", "## 3. Throughput ceiling", "## 4. Overhead at 1,000/s",
		"## 5. Memory of a full bucket", "### Large payloads", " 40 of 40 ", "## 6. Redis global pacing",
		"## 9. An idle daemon", "| % of one core |", "## 10. Many lanes in one process", "| JetStream ", "| in-memory ",
		"| shaper ", "| x/time/rate ", "| uber ratelimit ", "| uber WithoutSlack ", "| time.Ticker ",
		"| shaper lane, 1e6/s, no-op sink ", "| nats.go Consume + Ack (ceiling) ", "CPU share of ceiling",
		"### The same at 100/s", "### The same at 10,000/s", "vs x/time/rate",
		"shaper's lane vs Consume + x/time/rate + Ack", "### The judged ratio: paired runs", "(median of 2 pairs;",
		"## 7. CPU per departure against clock_nanosleep", "| clock_nanosleep ", "| clock_nanosleep raw ",
		"shaper vs the issue's clock_nanosleep loop", "CPU hog on the other core",
		"## 11. HTTP sink at 5,000/s", "| shaper lane, HTTP sink ", "| bare net/http loop ",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Section 6 needs redis-server; without it (outside CI) it says why.
	if _, err := exec.LookPath("redis-server"); err == nil || os.Getenv("CI") == "true" {
		for _, want := range []string{"| round trips/dep |", "| 100 ", "| 1,000 ", "| 10,000 "} {
			if !strings.Contains(md[strings.Index(md, "## 6. Redis"):], want) {
				t.Errorf("section 6 lacks %q", want)
			}
		}
	}
	if strings.Contains(md, "Failed measurements") {
		t.Errorf("some measurements failed:\n%s", md)
	}
}

// TestBenchSectionHTTP runs `go run ./bench -section http -quick`: every
// request of every sender reaches the downstream process (exit code 0) and
// the section's table and headline are printed.
func TestBenchSectionHTTP(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 15,000 requests")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-section", "http", "-quick"}, &stdout, &stderr); code != 0 {
		t.Fatalf("bench -section http exited %d:\n%s", code, stderr.String())
	}
	for _, want := range []string{"## 11. HTTP sink at 5,000/s", "| shaper lane, HTTP sink ", "| bare net/http loop ",
		"| floor: raw writes, evenly paced ", "The floor row's own account",
		"| shaper lane, no-op sink ", "- HTTP sink at 5,000/s to a downstream process", "The floor row (no client, no lane"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("section lacks %q:\n%s", want, stdout.String())
		}
	}
	// SPEC G1 at the downstream's kernel stamps, windows of every length
	// of 1 ms or more: the lane's headline says where a window broke.
	if !strings.Contains(stdout.String(), "), within the G1 window bounds;") {
		t.Errorf("the lane broke G1 at the downstream:\n%s", stdout.String())
	}
}

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestMaxInWindow(t *testing.T) {
	at := ms(0, 10, 20, 20, 31, 1000)
	for _, c := range []struct {
		w    time.Duration
		want int
	}{{0, 2}, {9 * time.Millisecond, 2}, {10 * time.Millisecond, 3}, {11 * time.Millisecond, 3},
		{21 * time.Millisecond, 4}, {31 * time.Millisecond, 5}, {time.Second, 6}} {
		if got := maxInWindow(at, c.w); got != c.want {
			t.Errorf("window %s: got %d, want %d", c.w, got, c.want)
		}
	}
}

func TestIdealWindow(t *testing.T) {
	for _, c := range []struct {
		w    time.Duration
		rate float64
		want int
	}{{time.Millisecond, 100, 1}, {10 * time.Millisecond, 100, 2}, {time.Second, 100, 101},
		{time.Millisecond, 1000, 2}, {time.Millisecond, 50000, 51}, {10 * time.Millisecond, 10000, 101}} {
		if got := idealWindow(c.w, c.rate); got != c.want {
			t.Errorf("idealWindow(%s, %v) = %d, want %d", c.w, c.rate, got, c.want)
		}
	}
}

func TestJudge(t *testing.T) {
	// Limit 100/s: 10 ms minimum after the previous accepted departure.
	s := series{at: ms(0, 10, 19, 21, 30, 31, 45)}
	j := judge(s, 100)
	// 0 ok, 10 ok, 19 rejected (9 after 10), 21 ok (11 after 10),
	// 30 rejected (9 after 21), 31 ok (10 after 21), 45 ok.
	if j.rejected != 2 || j.minGap != time.Millisecond {
		t.Errorf("judge: %d rejected, min gap %s; want 2 and 1ms", j.rejected, j.minGap)
	}
}

func TestFmtInt(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 50000: "50,000", 1234567: "1,234,567", -1500: "-1,500"} {
		if got := fmtInt(v); got != want {
			t.Errorf("fmtInt(%v) = %q, want %q", v, got, want)
		}
	}
}
