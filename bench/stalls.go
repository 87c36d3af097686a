package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"
)

// envStallProbe, set to a duration, makes this binary the stall probe's
// process: it spins for that long and prints the probe (stallChild).
const envStallProbe = "SHAPERBENCH_STALL_PROBE"

// stallGap is the shortest gap between two clock reads of a spinning thread
// that probeStalls counts as the machine's: a read takes ~50 ns, the
// kernel's tick and an interrupt a few µs, so a gap of 100 µs or more is the
// thread not running at all (a VM's host that deschedules its vCPU, another
// process preempting it).
const stallGap = 100 * time.Microsecond

// stallSpan is how long the stall probe spins, at the start and at the end of a
// full run.
const stallSpan = 3 * time.Second

// stallProbe is what the machine took from threads that wanted to run: one
// thread per core spins reading the clock and sums its gaps of stallGap or
// more. Steal time is not counted by every hypervisor (this firecracker VM's
// /proc/stat shows none), and other processes' load (the report's load
// columns) does not show a host that deschedules a vCPU; this does. A pacer
// can make up lateness only within an interval (SPEC G1's windows: a
// departure after a longer stall cannot be followed by a catch-up without a
// window holding one too many), so a rate falls short by about the share of
// the time lost in stalls longer than an interval wherever its threads run
// on a busy machine (docs/performance.md, session 26).
type stallProbe struct {
	span    time.Duration // how long each thread spun
	threads int           // one per core (GOMAXPROCS)
	lost    time.Duration // the sum of the gaps ≥ stallGap, all threads
	gaps    int           // how many such gaps
	over1ms int           // how many of them lasted 1 ms or more
	longest time.Duration
}

// probeStallsApart runs probeStalls in a process of its own (this binary
// again): in the bench's process its goroutines would take turns with the
// bench's own (a monitor, a timer), which is the process, not the machine.
// An error is reported as a probe of no threads ("not measured").
func probeStallsApart(span time.Duration) (stallProbe, error) {
	exe, err := os.Executable()
	if err != nil {
		return stallProbe{}, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envStallProbe+"="+span.String())
	out, err := cmd.Output()
	if err != nil {
		return stallProbe{}, fmt.Errorf("stall probe process: %w", err)
	}
	var p stallProbe
	var spanNs, lostNs, longestNs int64
	if _, err := fmt.Sscanf(string(out), "STALLS %d %d %d %d %d %d", &spanNs, &p.threads, &lostNs, &p.gaps, &p.over1ms, &longestNs); err != nil {
		return stallProbe{}, fmt.Errorf("stall probe process printed %q: %w", out, err)
	}
	p.span, p.lost, p.longest = time.Duration(spanNs), time.Duration(lostNs), time.Duration(longestNs)
	return p, nil
}

// stallChild is the stall probe's process: it spins for span (a
// time.Duration string) and prints one line that probeStallsApart reads.
func stallChild(span string, stdout io.Writer) int {
	d, err := time.ParseDuration(span)
	if err != nil || d <= 0 {
		fmt.Fprintf(os.Stderr, "bench: %s=%q: want a positive duration\n", envStallProbe, span)
		return 2
	}
	p := probeStalls(d)
	fmt.Fprintf(stdout, "STALLS %d %d %d %d %d %d\n", int64(p.span), p.threads, int64(p.lost), p.gaps, p.over1ms, int64(p.longest))
	return 0
}

// probeStalls spins one goroutine per P for span, all at once (both cores
// busy, as under a lane at full rate), and returns the gaps they saw. The
// goroutines are not locked to their threads: a goroutine that sysmon
// preempts (every 10 ms) resumes at once on its P when nothing else is
// runnable, where a locked one waits for its thread to be woken.
func probeStalls(span time.Duration) stallProbe {
	n := runtime.GOMAXPROCS(0)
	p := stallProbe{span: span, threads: n}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lost, longest time.Duration
			var gaps, over1ms int
			start := time.Now()
			prev := start
			for {
				now := time.Now()
				if g := now.Sub(prev); g >= stallGap {
					lost += g
					gaps++
					if g >= time.Millisecond {
						over1ms++
					}
					longest = max(longest, g)
				}
				prev = now
				if now.Sub(start) >= span {
					break
				}
			}
			mu.Lock()
			p.lost += lost
			p.gaps += gaps
			p.over1ms += over1ms
			p.longest = max(p.longest, longest)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return p
}

// share is the part (0–1) of the threads' time lost in stalls.
func (p stallProbe) share() float64 {
	if p.span <= 0 || p.threads == 0 {
		return 0
	}
	return p.lost.Seconds() / (p.span.Seconds() * float64(p.threads))
}

// String reads as the report's run table and headline give it.
func (p stallProbe) String() string {
	if p.threads == 0 {
		return "not measured"
	}
	return fmt.Sprintf("%.2f %% of %d spinning threads' time over %s in %d gaps ≥ %s (%d of 1 ms or more, the longest %.2f ms)",
		100*p.share(), p.threads, p.span, p.gaps, fmtStallGap(), p.over1ms, float64(p.longest.Microseconds())/1e3)
}

func fmtStallGap() string { return fmt.Sprintf("%d µs", stallGap.Microseconds()) }

// stallHeadline says what the machine's own stalls cost every paced row, or
// "" when they were not measured (quick runs, single sections).
func (r *Results) stallHeadline() string {
	if len(r.stalls) < 2 {
		return ""
	}
	worst := r.stalls[0]
	if r.stalls[1].share() > worst.share() {
		worst = r.stalls[1]
	}
	return fmt.Sprintf("The machine itself stalled running threads: with a thread spinning on each core it took %.2f %% (start) and %.2f %% (end) of their time in gaps of %s or more, %d and %d of them 1 ms or longer (the longest %.2f ms). No pacer makes up a stall longer than its lag (under an interval: SPEC G1's windows forbid the catch-up), so a paced row whose threads ran on busy cores falls short of its rate by what such stalls took from them, once for each thread on its departure path that one hits (the pacer's, a task's, net/http's writer): %.2f %% of a busy thread's time here.",
		100*r.stalls[0].share(), 100*r.stalls[1].share(), fmtStallGap(), r.stalls[0].over1ms, r.stalls[1].over1ms,
		float64(max(r.stalls[0].longest, r.stalls[1].longest).Microseconds())/1e3, 100*worst.share())
}

// probeStalls adds a stall probe of the machine to the run (stallSpan, in a
// process of its own); a failed probe is a problem of the report.
func (r *Results) probeStalls(when string, logf func(string, ...any)) {
	p, err := probeStallsApart(stallSpan)
	if err != nil {
		r.problems = append(r.problems, "machine stalls at the "+when+": "+err.Error())
	}
	r.stalls = append(r.stalls, p)
	logf("machine stalls at the %s: %s", when, p)
}
