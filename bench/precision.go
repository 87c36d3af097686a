package main

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"
)

// windows are the sliding windows of the precision tables (SPEC G1).
var windows = []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second}

// series is what one run of a pacer produced: departure instants as offsets
// from the start of the run, and the CPU the whole process used meanwhile.
type series struct {
	at   []time.Duration
	cpu  time.Duration
	wall time.Duration
	load float64 // other processes' share of the machine meanwhile
	late lateness
}

// runPacer releases departures from k at perSecond for about d of wall
// time (or until maxN departures, whichever comes first) under a permanent
// backlog, and returns their instants. Departures are stamped by the taker
// itself, right after the pacer let them go.
func runPacer(k pacerKind, perSecond float64, d time.Duration) series {
	maxN := int(perSecond*d.Seconds()*1.5) + 64
	at := make([]time.Duration, 0, maxN)
	t := k.make(perSecond)
	defer t.close()
	runtime.GC()
	lm := startLoad()
	ru0 := cpuTime()
	start := time.Now()
	for len(at) < maxN {
		dep := t.take().Sub(start)
		at = append(at, dep)
		if dep >= d {
			break
		}
	}
	wall := time.Since(start)
	s := series{at: at, cpu: cpuTime() - ru0, wall: wall, load: lm.other()}
	if st, ok := t.(*shaperTaker); ok {
		if rw, ok := st.w.(*recWaiter); ok {
			s.late = rw.summary(time.Duration(float64(time.Second) / perSecond))
		}
	}
	return s
}

// precision is one cell of section 1.
type precision struct {
	target        float64
	n             int
	achieved      float64 // departures per second, first to last
	errPct        float64 // (achieved − target) / target, in %
	p50, p99, max time.Duration
	win           []int // max departures in any closed window of windows[i]; −1 when the run was too short
	cpuPerDep     time.Duration
	load          float64
	late          lateness // shaper rows: the waiter's wake-ups
}

func analyse(s series, target float64) precision {
	p := precision{target: target, n: len(s.at), load: s.load, late: s.late}
	if len(s.at) < 2 {
		return p
	}
	span := s.at[len(s.at)-1] - s.at[0]
	p.achieved = float64(len(s.at)-1) / span.Seconds()
	p.errPct = (p.achieved - target) / target * 100
	gaps := make([]time.Duration, len(s.at)-1)
	for i := 1; i < len(s.at); i++ {
		gaps[i-1] = s.at[i] - s.at[i-1]
	}
	slices.Sort(gaps)
	p.p50 = quantile(gaps, 0.50)
	p.p99 = quantile(gaps, 0.99)
	p.max = gaps[len(gaps)-1]
	for _, w := range windows {
		if span < w {
			p.win = append(p.win, -1)
			continue
		}
		p.win = append(p.win, maxInWindow(s.at, w))
	}
	p.cpuPerDep = s.cpu / time.Duration(len(s.at))
	return p
}

// quantile returns the q-quantile of sorted xs (nearest rank).
func quantile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// maxInWindow returns the largest number of instants of sorted at that lie in
// one closed window [t, t+w]. A window holding the most instants can always
// be slid to start at one of them, so only those starts are tried.
func maxInWindow(at []time.Duration, w time.Duration) int {
	best, j := 0, 0
	for i := range at {
		if j < i {
			j = i
		}
		for j < len(at) && at[j]-at[i] <= w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// idealWindow is the G1 bound with slack 0: floor(W × rate) + 1.
func idealWindow(w time.Duration, perSecond float64) int {
	return int(math.Floor(w.Seconds()*perSecond+1e-9)) + 1
}

// judgement is one cell of section 2: a strict downstream that rejects any
// departure sooner than 1/limit after the previous accepted one.
type judgement struct {
	limit    float64
	n        int
	rejected int
	minGap   time.Duration // smallest gap between consecutive departures
	achieved float64
	load     float64
}

func judge(s series, limit float64) judgement {
	j := judgement{limit: limit, n: len(s.at), minGap: time.Duration(math.MaxInt64), load: s.load}
	if len(s.at) == 0 {
		return j
	}
	minGap := time.Duration(float64(time.Second) / limit)
	last := s.at[0]
	for i := 1; i < len(s.at); i++ {
		j.minGap = min(j.minGap, s.at[i]-s.at[i-1])
		if s.at[i]-last < minGap {
			j.rejected++
			continue
		}
		last = s.at[i]
	}
	if span := s.at[len(s.at)-1] - s.at[0]; span > 0 {
		j.achieved = float64(len(s.at)-1) / span.Seconds()
	}
	return j
}

// fmtDur formats d in microseconds with a precision that suits its size.
func fmtUs(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	switch {
	case us >= 100:
		return fmt.Sprintf("%.0f", us)
	case us >= 10:
		return fmt.Sprintf("%.1f", us)
	default:
		return fmt.Sprintf("%.2f", us)
	}
}
