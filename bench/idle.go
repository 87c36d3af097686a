package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// Section 9 (issue 15): what an idle daemon costs. The shaper binary, built
// once with `go build`, runs as a child process with idleLanes configured
// lanes on a NATS server in the benchmark's process (internal/testserver) and
// no traffic, so that the server's own CPU is not the child's; the
// bench scrapes its /metrics every idleScrapeEvery as Prometheus would.
// After a settling time, the child's CPU time (every thread's, from /proc)
// and its threads' context switches are read over the span. Everything the
// daemon does at idle is in it: each lane's house loop, its pull request
// expiring every FetchExpiry (all lanes' on one grid), the precise
// waiter's watcher, the Go runtime, and the scrapes.

// idleBound is issue 15's bound: under 0.5 % of one core in total.
const idleBound = 0.005

// idleLanes is the number of configured lanes.
const idleLanes = 10

// idleSettle is the time the daemon runs after it is ready and before the
// span starts, so that start-up (stream and consumer creation, the first
// pull requests) is not counted.
const idleSettle = 2 * time.Second

// idleRow is the section's result.
type idleRow struct {
	lanes       int
	span        time.Duration
	scrapeEvery time.Duration
	scrapes     int
	cpu         time.Duration // user + system, every thread (schedstat)
	cpuTicks    time.Duration // the same from /proc/PID/stat (10 ms ticks), a cross-check
	switches    int64         // voluntary + involuntary context switches of every thread
	threads     int
	rssKiB      int64
	err         error
}

// share is the CPU used as a share of one core.
func (r idleRow) share() float64 {
	if r.span <= 0 {
		return 0
	}
	return r.cpu.Seconds() / r.span.Seconds()
}

// runIdle measures an idle daemon for span, scraping every scrapeEvery.
func runIdle(span, scrapeEvery time.Duration, logf func(string, ...any)) idleRow {
	row := idleRow{lanes: idleLanes, span: span, scrapeEvery: scrapeEvery}
	row.err = withServers(func(tb testing.TB) error {
		bin, err := buildShaperBinary(tb.TempDir())
		if err != nil {
			return err
		}
		ns := testserver.NATS(tb)
		dir := tb.TempDir()
		port := testserver.FreePort(tb)
		cfgPath := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(cfgPath, []byte(idleConfig(ns.ClientURL(), port, idleLanes)), 0o600); err != nil {
			return err
		}
		logF, err := os.Create(filepath.Join(dir, "shaper.log"))
		if err != nil {
			return err
		}
		defer logF.Close()
		cmd := exec.Command(bin, "run", "-c", cfgPath)
		cmd.Stdout, cmd.Stderr = logF, logF
		if err := cmd.Start(); err != nil {
			return err
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		defer func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}()
		admin := "http://127.0.0.1:" + strconv.Itoa(port)
		if err := awaitReady(admin+"/readyz", 30*time.Second, exited); err != nil {
			b, _ := os.ReadFile(logF.Name())
			return fmt.Errorf("%w\n%s", err, tail(string(b), 2000))
		}
		time.Sleep(idleSettle)
		logf("idle daemon: %d lanes, pid %d, measuring %s, a scrape every %s", idleLanes, cmd.Process.Pid, span, scrapeEvery)
		row.err = measureIdle(&row, cmd.Process.Pid, admin+"/metrics")
		return row.err
	})
	return row
}

// measureIdle reads the child's counters, scrapes at 0, scrapeEvery, … within
// span, and reads them again at the end of span.
func measureIdle(row *idleRow, pid int, metricsURL string) error {
	before, err := readProc(pid)
	if err != nil {
		return err
	}
	start := time.Now()
	client := &http.Client{Timeout: 5 * time.Second}
	for at := time.Duration(0); at < row.span; at += row.scrapeEvery {
		time.Sleep(time.Until(start.Add(at)))
		if err := scrape(client, metricsURL); err != nil {
			return err
		}
		row.scrapes++
	}
	time.Sleep(time.Until(start.Add(row.span)))
	after, err := readProc(pid)
	if err != nil {
		return err
	}
	row.span = time.Since(start)
	row.cpu = after.run - before.run
	row.cpuTicks = after.ticks - before.ticks
	row.switches = after.switches - before.switches
	row.threads, row.rssKiB = after.threads, after.rssKiB
	return nil
}

func scrape(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// awaitReady polls url until it answers 200.
func awaitReady(url string, timeout time.Duration, exited <-chan error) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("shaper exited before it was ready: %v", err)
		default:
		}
		if resp, err := c.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s", url, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// idleConfig is a daemon with n lanes on the NATS server at url, one stream
// each, log sinks, and the admin endpoint on port; every other key has its
// default.
func idleConfig(url string, port, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "nats:\n  url: %q\nadmin:\n  listen: 127.0.0.1:%d\nlog:\n  level: warn\ndownstreams:\n", url, port)
	for i := range n {
		fmt.Fprintf(&b, "  lane%02d:\n    source:\n      stream: IDLE%02d\n      subjects: [idle.%02d.>]\n", i, i, i)
		b.WriteString("    rate:\n      limit: 100/s\n    sink:\n      kind: log\n")
	}
	return b.String()
}

// buildShaperBinary builds cmd/shaper into dir with the go command that
// runs the benchmark.
func buildShaperBinary(dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "shaper")
	out, err := exec.Command(goTool, "build", "-o", bin, "github.com/shaper-dev/shaper/cmd/shaper").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build cmd/shaper: %v\n%s", err, out)
	}
	return bin, nil
}

// procSample is what /proc says about a process at one instant.
type procSample struct {
	run      time.Duration // CPU time of all live threads (schedstat, ns)
	ticks    time.Duration // utime + stime of the process (stat, USER_HZ ticks)
	switches int64         // context switches of all live threads
	threads  int
	rssKiB   int64
}

// readProc samples /proc/PID: the per-thread schedstat run time (ns
// resolution; threads do not exit in a Go daemon at idle), the process's
// utime + stime, the threads' voluntary and involuntary context switches
// (each voluntary one is a thread going to sleep, so the number of wake-ups),
// and VmRSS.
func readProc(pid int) (procSample, error) {
	var s procSample
	base := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(base + "/stat")
	if err != nil {
		return s, fmt.Errorf("idle daemon: %w (needs Linux /proc)", err)
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		return s, errors.New("idle daemon: short /proc/PID/stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.ticks = time.Duration(ut+st) * time.Second / clockTicks
	tasks, err := os.ReadDir(base + "/task")
	if err != nil {
		return s, err
	}
	for _, t := range tasks {
		dir := base + "/task/" + t.Name()
		if b, err := os.ReadFile(dir + "/schedstat"); err == nil {
			if v := strings.Fields(string(b)); len(v) > 0 {
				ns, _ := strconv.ParseInt(v[0], 10, 64)
				s.run += time.Duration(ns)
			}
		}
		if b, err := os.ReadFile(dir + "/status"); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				k, v, ok := strings.Cut(line, ":")
				if ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					s.switches += n
				}
			}
		}
		s.threads++
	}
	if b, err := os.ReadFile(base + "/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				s.rssKiB, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			}
		}
	}
	return s, nil
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// idleMarkdown renders section 9.
func (r *Results) idleMarkdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("## 9. An idle daemon\n\n")
	row := r.idle
	if row == nil {
		w("Not run.\n\n")
		return b.String()
	}
	w("The `shaper` binary (`go build ./cmd/shaper`) runs as a child process with %d configured lanes (one stream\n", row.lanes)
	w("each, defaults otherwise, log sinks) on a NATS server in the benchmark's process, with no traffic. The benchmark scrapes its\n")
	w("`/metrics` every %s, as Prometheus would, and reads `/proc` of the child before and after %s that start\n", row.scrapeEvery, fmtSeconds(row.span.Round(100*time.Millisecond)))
	w("%s after `/readyz` answered: CPU is the run time of every thread (`/proc/PID/task/*/schedstat`; the\n", idleSettle)
	w("process's `utime + stime` in 10 ms ticks as a cross-check), wake-ups are the threads' context switches.\n")
	w("Everything the daemon does at idle is counted: house loops, the pull request each lane keeps open (it\n")
	w("asks for 32 messages, expires at the next whole second of one grid for all lanes, and is sent again),\n")
	w("the runtime, and the scrapes. Issue 15's bound: under %.1f %% of\n", 100*idleBound)
	w("one core in total.")
	if r.opts.Quick {
		w(" In quick mode the span is short: a smoke number, not the measurement.")
	}
	w("\n\n")
	if row.err != nil {
		w("Failed: %v\n\n", row.err)
		return b.String()
	}
	t := table{head: []string{"lanes", "span", "scrapes", "CPU ms", "CPU ms (ticks)", "% of one core", "bound %", "wake-ups /s", "threads", "RSS MiB"}}
	t.add(strconv.Itoa(row.lanes), fmtSeconds(row.span.Round(100*time.Millisecond)), strconv.Itoa(row.scrapes),
		fmt.Sprintf("%.1f", float64(row.cpu)/float64(time.Millisecond)), strconv.FormatInt(row.cpuTicks.Milliseconds(), 10),
		fmt.Sprintf("%.3f", 100*row.share()), fmt.Sprintf("%.1f", 100*idleBound),
		fmt.Sprintf("%.0f", float64(row.switches)/row.span.Seconds()), strconv.Itoa(row.threads),
		fmt.Sprintf("%.1f", float64(row.rssKiB)/1024))
	w("%s\n", t.String())
	return b.String()
}

// idleHeadline is section 9's headline.
func (r *Results) idleHeadline() []string {
	row := r.idle
	if row == nil || row.err != nil {
		return nil
	}
	verdict := "under"
	if row.share() >= idleBound {
		verdict = "over"
	}
	return []string{fmt.Sprintf("An idle daemon with %d lanes used %.3f %% of one core over %s with a scrape every %s, %s the %.1f %% bound (%.0f thread wake-ups/s).",
		row.lanes, 100*row.share(), fmtSeconds(row.span.Round(100*time.Millisecond)), row.scrapeEvery, verdict, 100*idleBound, float64(row.switches)/row.span.Seconds())}
}
