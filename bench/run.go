package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Options selects a run.
type Options struct {
	// Quick shortens every measurement (CI).
	Quick bool
	// Command is printed in the report.
	Command string
	// Progress receives one line per measurement (nil: none).
	Progress io.Writer
	// OnlyCPU runs section 7 alone (-section cpu).
	OnlyCPU bool
	// OnlyHTTP runs section 11 alone (-section http).
	OnlyHTTP bool
	// Only runs one section of issue 15 alone: idle, lanes or redis
	// (-section; issue15.go).
	Only string
	// Section, when "throughput" or "e2e", runs section 3 or 4 alone
	// (-section; e2e.go).
	Section string
	// FixedRates, when not empty, replaces the rates of section 4 (-rate).
	FixedRates []float64
	// FixedMsgs, when > 0, is the size of the streams of FixedRates (-msgs);
	// OnlyRows keeps the rows of section 4 whose name contains it (-only).
	FixedMsgs int
	OnlyRows  string
	// RowProfile, when set, writes a CPU profile of each row of section 4
	// to RowProfile-<rate>-<row>.prof (-section e2e -cpuprofile).
	RowProfile string
}

// busyLimit is the share of the machine used by other processes above which
// a pacing cell is measured again; retryBudget bounds the time spent so.
const (
	busyLimit   = 0.15
	retryBudget = 30 * time.Second
	quietBudget = 30 * time.Second // waiting for a quiet machine before cells
)

// plan is how long and how much each section measures.
type plan struct {
	cell        time.Duration // one pacer at one rate
	judgeCell   time.Duration // one pacer under the judge
	rates       []float64
	judgeLimits []float64
	thrMsgs     int // messages in the throughput stream
	thrReps     int
	fixedRate   float64
	fixedMsgs   int           // messages of the fixed-rate stream (section 4)
	fixedPairs  int           // section 4's paired repeats of the lane and x/time/rate at each rate (e2e.go)
	memMsgs     int           // bucket of section 5, synthetic messages
	memJSMsgs   int           // bucket of section 5, messages fetched from JetStream
	largeMsgs   int           // section 5's large-payload cell, messages of 512 KiB
	cpuCell     time.Duration // one loop of section 7 at one rate
	httpCell    time.Duration // one sender of section 11
	issue15                   // sections 6, 9 and 10 (issue15.go)
}

func planFor(quick bool) plan {
	p := plan{
		cell:        2 * time.Second,
		judgeCell:   4 * time.Second,
		rates:       []float64{100, 1000, 10000, 50000},
		judgeLimits: []float64{100, 1000},
		thrMsgs:     50_000,
		thrReps:     9, // paired shares (thrPaired): a drift of the machine moves fewer of them
		fixedRate:   1000,
		fixedMsgs:   5000,
		fixedPairs:  5, // with the first pass (lane first), 3 runs of each order
		memMsgs:     100_000,
		memJSMsgs:   100_000,
		largeMsgs:   400, // 200 MiB, 20 s at 20/s
		cpuCell:     4 * time.Second,
		httpCell:    10 * time.Second,
		issue15:     issue15Plan(quick),
	}
	if quick {
		p.cell = 200 * time.Millisecond
		p.judgeCell = 400 * time.Millisecond
		p.thrMsgs = 10_000
		p.thrReps = 1
		p.fixedMsgs = 1100
		p.fixedPairs = 1
		p.memJSMsgs = 10_000
		p.largeMsgs = 40
		p.cpuCell = 300 * time.Millisecond
		p.httpCell = time.Second
	}
	return p
}

// Results holds everything one run measured.
type Results struct {
	opts      Options
	plan      plan
	started   time.Time
	took      time.Duration
	env       [][2]string
	kinds     []pacerKind
	prec      map[float64][]precision // by rate, in the order of kinds
	judged    map[float64][]judgement // by judge limit, in the order of kinds
	thr       []thrRow
	fixed     []endToEnd // section 4 at plan.fixedRate
	fixedAt   []fixedRun // section 4 at the other rates (e2e.go)
	pairs     []cpuPairs // section 4's paired repeats, by rate (e2e.go)
	mem       []memoryRow
	large     []largeRow   // section 5's large-payload cells
	cpu       []cpuCell    // section 7
	hog       string       // the command of section 7's CPU hog
	longrun   []longRunRow // section 8 (full runs only)
	longNotes []string     // section 8's misses: reported, not failures
	http      []httpRow    // section 11
	problems  []string
	retries   int
	quietWait time.Duration // spent waiting for a quiet machine
	load      float64       // other processes' share of the machine over the run
	stalls    []stallProbe  // the machine's stalls at the start and the end of a full run (stalls.go)

	issue15Results // sections 6, 9 and 10 (issue15.go)
}

// thrRow aggregates the repetitions of one throughput contender.
type thrRow struct {
	name string
	note string
	reps []endToEnd
}

// median returns the repetition with the median rate.
func (t thrRow) median() endToEnd {
	if len(t.reps) == 0 { // left out (-only)
		return endToEnd{name: t.name}
	}
	r := slices.Clone(t.reps)
	slices.SortFunc(r, func(a, b endToEnd) int {
		switch {
		case a.perSecond < b.perSecond:
			return -1
		case a.perSecond > b.perSecond:
			return 1
		}
		return 0
	})
	return r[len(r)/2]
}

// medianCPU is the median of the repetitions' CPU per message.
func (t thrRow) medianCPU() time.Duration {
	var xs []time.Duration
	for _, r := range t.reps {
		xs = append(xs, r.cpuPerMsg)
	}
	return medianOf(xs)
}

// thrPaired returns, for every repetition in which the ceiling (rows[0],
// the bare Consume + Ack) and shaper's lane (rows[2]) both ran without an
// error, the lane's msgs/s as a share of the ceiling's and the ceiling's
// CPU per message as a share of the lane's, in per cent: the two lines of
// issue 15, each from contenders run back to back.
func thrPaired(rows []thrRow) (rate, cpu []float64) {
	if len(rows) < 3 {
		return nil, nil
	}
	ceil, lane := rows[0].reps, rows[2].reps
	for i := range min(len(ceil), len(lane)) {
		c, s := ceil[i], lane[i]
		if c.err != nil || s.err != nil || c.perSecond <= 0 || s.cpuPerMsg <= 0 {
			continue
		}
		rate = append(rate, 100*s.perSecond/c.perSecond)
		cpu = append(cpu, 100*float64(c.cpuPerMsg)/float64(s.cpuPerMsg))
	}
	return rate, cpu
}

func (t thrRow) spread() (lo, hi float64) {
	if len(t.reps) == 0 {
		return 0, 0
	}
	lo, hi = t.reps[0].perSecond, t.reps[0].perSecond
	for _, r := range t.reps {
		lo, hi = min(lo, r.perSecond), max(hi, r.perSecond)
	}
	return lo, hi
}

// Run performs every measurement of opts, sequentially (they would disturb
// each other on 2 cores).
//
// It is long on purpose: the sequence of measurements, each a few lines of
// setup and a call, reads as the plan of the run.
func Run(opts Options) (*Results, error) {
	res := &Results{
		opts: opts, plan: planFor(opts.Quick), started: time.Now(),
		kinds:  pacerKinds(),
		prec:   map[float64][]precision{},
		judged: map[float64][]judgement{},
	}
	res.env = environment(opts)
	whole := startLoad()
	logf := func(format string, a ...any) {
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "bench: "+format+"\n", a...)
		}
	}
	p := res.plan

	// A cell run while other processes kept the machine busy is run again
	// (full mode only, within a time budget) and the quieter run is kept.
	var retrySpent time.Duration
	again := func(load float64) bool {
		return !opts.Quick && load > busyLimit && retrySpent < retryBudget
	}
	quiet := func() {
		if !opts.Quick && res.quietWait < quietBudget {
			res.quietWait += waitQuiet(busyLimit, min(5*time.Second, quietBudget-res.quietWait))
		}
	}
	measure := func(k pacerKind, perSecond float64, d time.Duration) series {
		quiet()
		s := runPacer(k, perSecond, d)
		if again(s.load) {
			t0 := time.Now()
			quiet()
			s2 := runPacer(k, perSecond, d)
			retrySpent += time.Since(t0)
			res.retries++
			if s2.load < s.load {
				s = s2
			}
		}
		return s
	}

	if opts.Only != "" {
		err := res.runOnly(logf)
		res.took = time.Since(res.started)
		res.load = whole.other()
		return res, err
	}
	if opts.OnlyCPU || opts.OnlyHTTP {
		if opts.OnlyCPU {
			res.runCPU(quiet, logf)
		} else {
			res.runHTTP(quiet, logf)
		}
		res.took = time.Since(res.started)
		res.load = whole.other()
		return res, nil
	}

	if opts.Section != "" {
		return res.runE2EOnly(quiet, logf)
	}

	// What the machine itself takes from running threads, before the
	// measurements and after them (stalls.go).
	if !opts.Quick {
		res.probeStalls("start", logf)
	}

	// 1. Pacing precision.
	for _, r := range p.rates {
		for _, k := range res.kinds {
			c := analyse(measure(k, r, p.cell), r)
			res.prec[r] = append(res.prec[r], c)
			logf("precision %-20s %6.0f/s: achieved %.1f/s, p99 %s µs, cpu %s µs/departure, other load %.0f %%",
				k.name, r, c.achieved, fmtUs(c.p99), fmtUs(c.cpuPerDep), 100*c.load)
		}
	}
	// 2. The strict judge, pacers at 99 % of its limit.
	for _, lim := range p.judgeLimits {
		for _, k := range res.kinds {
			j := judge(measure(k, 0.99*lim, p.judgeCell), lim)
			res.judged[lim] = append(res.judged[lim], j)
			logf("judge %-20s limit %5.0f/s: %d of %d rejected, other load %.0f %%", k.name, lim, j.rejected, j.n, 100*j.load)
		}
	}

	logf("sections 1-2 took %s", time.Since(res.started).Round(time.Millisecond))

	// 7. CPU per departure against clock_nanosleep, idle and with a hog.
	// It runs here, before NATS is started, so that no server shares the
	// process.
	res.runCPU(quiet, logf)
	logf("section 7 done at %s", time.Since(res.started).Round(time.Millisecond))

	// 11. The HTTP sink at 5,000/s against a bare net/http loop (no NATS).
	res.runHTTP(quiet, logf)

	// 3–5 run against an embedded NATS server.
	dir, err := os.MkdirTemp("", "shaper-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	env, err := startNATS(dir)
	if err != nil {
		return nil, err
	}
	defer env.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// 3. Throughput ceiling; 4. overhead at fixed rates.
	if err := res.runThroughput(ctx, env, quiet, logf); err != nil {
		return nil, err
	}
	logf("section 3 done at %s", time.Since(res.started).Round(time.Millisecond))
	retry := func(f func() endToEnd) endToEnd {
		quiet()
		r := f()
		if again(r.load) && r.err == nil {
			t0 := time.Now()
			quiet()
			r2 := f()
			retrySpent += time.Since(t0)
			res.retries++
			if r2.err == nil && r2.load < r.load {
				r = r2
			}
		}
		return r
	}
	if err := res.runFixed(ctx, env, retry, logf); err != nil {
		return nil, err
	}
	logf("section 4 done at %s", time.Since(res.started).Round(time.Millisecond))

	// 5. Memory of a full bucket (bench/memory.go).
	if err := res.runMemory(ctx, env, "", logf); err != nil {
		return nil, err
	}

	// 6, 9 and 10 (issue 15): Redis global pacing, an idle daemon, many lanes.
	res.runIssue15(ctx, env, quiet, logf)

	// 8. Long-run rate beside a CPU hog (full runs only: 10 s windows).
	if !opts.Quick {
		quiet()
		res.longrun, res.longNotes = runLongRunSection(false, logf)
		res.probeStalls("end", logf)
	}

	res.took = time.Since(res.started)
	res.load = whole.other()
	return res, nil
}

func (res *Results) runCPU(quiet func(), logf func(string, ...any)) {
	cells, hog, problems := runCPUSection(res.plan.cpuCell, quiet, logf)
	res.cpu, res.hog = cells, hog
	res.problems = append(res.problems, problems...)
}

func (res *Results) runHTTP(quiet func(), logf func(string, ...any)) {
	rows, problems := runHTTPSection(res.plan.httpCell, quiet, logf)
	res.http = rows
	res.problems = append(res.problems, problems...)
}

// environment describes the machine and the run.
func environment(opts Options) [][2]string {
	mode := "full"
	if opts.Quick {
		mode = "quick (-quick)"
	}
	return [][2]string{
		{"command", "`" + opts.Command + "`"},
		{"mode", mode},
		{"date", time.Now().UTC().Format("2006-01-02 15:04 UTC")},
		{"Go", runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH},
		{"CPU", cpuModel()},
		{"cores (GOMAXPROCS)", fmt.Sprintf("%d (%d)", runtime.NumCPU(), runtime.GOMAXPROCS(0))},
		{"kernel", kernel()},
	}
}

// cpuModel reads the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
