package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
)

// The long-run rate of SPEC G1 (issue 10): a real drain.Lane with the
// daemon's precise waiter, under a backlog, at the default min_spacing,
// measured at departure (the instant the lane stamps on the message), with
// a CPU hog on the other core. Every 10 s window of the run (sliding, from
// each departure) must hold limit × 10 s within 0.5 %.

// longRunRow is one rate's result.
type longRunRow struct {
	limit      float64
	span       time.Duration // whole run
	hog        bool
	departures int
	lo, hi     int // fewest and most departures in a 10 s window
	want       int // limit × 10 s
	tol        int // 0.5 % of want, at least 1 (a window of whole intervals holds want + 1)
	worst1s    int // most departures in a window of a whole number of intervals (1 s)
	bound1s    int
	minGapIv   float64 // smallest gap between departures, in intervals (≤ 1,000/s)
	lateP99    time.Duration
}

// depSink records the departure instant of every message.
type depSink struct {
	mu  sync.Mutex
	dep []time.Time
}

func (s *depSink) Send(_ context.Context, m *shaper.Message) error {
	s.mu.Lock()
	s.dep = append(s.dep, m.Departed)
	s.mu.Unlock()
	return nil
}

func longRunConfig(limit float64) config.Lane {
	cfg := laneConfig("MEM", "mem.>", "bench-longrun", limit, 0)
	cfg.Rate.MinSpacing = config.DefaultMinSpacing
	cfg.Task.MaxInFlight = 64
	cfg.Bucket.Capacity = max(1000, int(limit/10))
	return cfg
}

// runLongRun runs one lane at limit for span and analyses its departures.
func runLongRun(limit float64, span time.Duration, hog bool) (longRunRow, error) {
	row := longRunRow{limit: limit, span: span, hog: hog}
	n := int(limit*span.Seconds()) + int(limit) + 100
	sink := &depSink{dep: make([]time.Time, 0, n)}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg).Lane("longrun", limit)
	lane, err := drain.New("longrun", longRunConfig(limit), newMemSource(n), sink, drain.WithMetrics(m))
	if err != nil {
		return row, err
	}
	defer shaperGC()()
	lane.Start()
	time.Sleep(span)
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	lane.Drain(ctx)
	cancel()
	sink.mu.Lock()
	deps := append([]time.Time(nil), sink.dep...)
	sink.mu.Unlock()
	sort.Slice(deps, func(i, j int) bool { return deps[i].Before(deps[j]) })
	row.departures = len(deps)
	if len(deps) < 2 {
		return row, fmt.Errorf("%v/s: %d departures", limit, len(deps))
	}
	// Sliding 10 s windows that end before the last departure.
	w := 10 * time.Second
	row.lo, row.hi = math.MaxInt, 0
	j := 0
	for i := range deps {
		if deps[i].Add(w).After(deps[len(deps)-1]) {
			break
		}
		for j < len(deps) && deps[j].Before(deps[i].Add(w)) {
			j++
		}
		row.lo, row.hi = min(row.lo, j-i), max(row.hi, j-i)
	}
	row.want = int(math.Round(limit * w.Seconds()))
	row.tol = max(1, int(math.Floor(0.005*float64(row.want))))
	at := make([]time.Duration, len(deps))
	for i, d := range deps {
		at[i] = d.Sub(deps[0])
	}
	row.worst1s = maxInWindow(at, time.Second)
	row.bound1s = int(math.Floor(limit+1e-9)) + 1
	iv := shaper.Limit(limit).Interval()
	row.minGapIv = math.Inf(1)
	for i := 1; i < len(deps); i++ {
		row.minGapIv = min(row.minGapIv, float64(deps[i].Sub(deps[i-1]))/float64(iv))
	}
	row.lateP99 = histQuantile(reg, metrics.LatenessName, 0.99)
	return row, nil
}

// histQuantile reads a quantile of a classic histogram from reg (the bucket
// upper bound where the cumulative count passes q).
func histQuantile(reg *prometheus.Registry, name string, q float64) time.Duration {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) == 0 {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		total := float64(h.GetSampleCount())
		for _, b := range h.GetBucket() {
			if float64(b.GetCumulativeCount()) >= q*total {
				return time.Duration(b.GetUpperBound() * float64(time.Second))
			}
		}
	}
	return 0
}

// longRunPlan is the rates and spans of the section: 60 s at 0.5/s and 1/s
// (30 and 60 departures), 15 s above; quick: 12 s and 11 s.
func longRunPlan(quick bool) []struct {
	limit float64
	span  time.Duration
} {
	long, short := 60*time.Second, 15*time.Second
	if quick {
		long, short = 12*time.Second, 11*time.Second
	}
	return []struct {
		limit float64
		span  time.Duration
	}{{0.5, long}, {1, long}, {100, short}, {1000, short}, {5000, short}, {10000, short}}
}

// runLongRunSection measures every rate of the plan beside a CPU hog.
func runLongRunSection(quick bool, logf func(string, ...any)) (rows []longRunRow, problems []string) {
	h, err := startHog()
	if err != nil {
		return nil, []string{"long-run rate: cannot start the CPU hog: " + err.Error()}
	}
	defer h.stop()
	for _, p := range longRunPlan(quick) {
		logf("long-run rate: %v/s for %v beside a CPU hog", p.limit, p.span)
		row, err := runLongRun(p.limit, p.span, true)
		if err != nil {
			problems = append(problems, "long-run rate: "+err.Error())
			continue
		}
		rows = append(rows, row)
		if row.lo < row.want-row.tol || row.hi > row.want+row.tol {
			problems = append(problems, fmt.Sprintf("long-run rate at %v/s: 10 s windows hold %d to %d departures, want %d ± %d (0.5 %%)",
				p.limit, row.lo, row.hi, row.want, row.tol))
		}
		if row.worst1s > row.bound1s {
			problems = append(problems, fmt.Sprintf("long-run rate at %v/s: %d departures in a 1 s window, bound %d",
				p.limit, row.worst1s, row.bound1s))
		}
	}
	return rows, problems
}

// longRunMarkdown renders the section.
func longRunMarkdown(rows []longRunRow) string {
	var b strings.Builder
	b.WriteString("| limit /s | run | departures | 10 s windows: fewest | most | want (± 0.5 %, ≥ 1) | shortfall | worst 1 s window | bound | min gap (intervals) | lateness p99 |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		gap := "–"
		if r.limit <= shaper.SpacingMaxRate {
			gap = fmt.Sprintf("%.3f", r.minGapIv)
		}
		fmt.Fprintf(&b, "| %g | %v | %d | %d | %d | %d ± %d | %+.2f %% | %d | %d | %s | %v |\n",
			r.limit, r.span, r.departures, r.lo, r.hi, r.want, r.tol, 100*float64(r.lo-r.want)/float64(r.want),
			r.worst1s, r.bound1s, gap, r.lateP99.Round(time.Microsecond))
	}
	return b.String()
}
