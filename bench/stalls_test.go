package main

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestProbeStalls: one thread per P spins for the span; what it reports
// lost fits in the threads' time, and the report says the share.
func TestProbeStalls(t *testing.T) {
	p := probeStalls(50 * time.Millisecond)
	if p.threads != runtime.GOMAXPROCS(0) {
		t.Fatalf("threads %d, want GOMAXPROCS %d", p.threads, runtime.GOMAXPROCS(0))
	}
	if p.lost < 0 || p.lost > time.Duration(p.threads)*(p.span+p.longest) {
		t.Fatalf("lost %v in %d threads × %v", p.lost, p.threads, p.span)
	}
	if p.gaps < p.over1ms || (p.gaps > 0) != (p.lost > 0) {
		t.Fatalf("gaps %d, over 1 ms %d, lost %v", p.gaps, p.over1ms, p.lost)
	}
	t.Log(p)
}

// TestProbeStallsApart: the probe's process spins and its line is read
// back whole.
func TestProbeStallsApart(t *testing.T) {
	p, err := probeStallsApart(50 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if p.span != 50*time.Millisecond || p.threads != runtime.GOMAXPROCS(0) || p.lost < 0 || p.gaps < p.over1ms {
		t.Fatalf("probe read back as %+v", p)
	}
	t.Log(p)
}

// TestStallShare: the share is the lost time over all threads' spans, and the
// headline names both probes and the worse share.
func TestStallShare(t *testing.T) {
	a := stallProbe{span: 3 * time.Second, threads: 2, lost: 30 * time.Millisecond, gaps: 40, over1ms: 9, longest: 3600 * time.Microsecond}
	b := stallProbe{span: 3 * time.Second, threads: 2, lost: 12 * time.Millisecond, gaps: 20, over1ms: 2, longest: time.Millisecond}
	if got := a.share(); got != 0.005 {
		t.Fatalf("share %v, want 0.005 (30 ms of 2 × 3 s)", got)
	}
	h := (&Results{stalls: []stallProbe{b, a}}).stallHeadline()
	for _, want := range []string{"0.20 % (start) and 0.50 % (end)", "2 and 9 of them", "the longest 3.60 ms", "0.50 % of a busy thread's time"} {
		if !strings.Contains(h, want) {
			t.Errorf("headline %q lacks %q", h, want)
		}
	}
	if (&Results{}).stallHeadline() != "" || (stallProbe{}).String() != "not measured" {
		t.Error("an unmeasured probe must say nothing in the headlines and 'not measured' in the table")
	}
}
