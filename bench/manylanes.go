package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources"
)

// Section 10 (issue 15): many lanes in one process. manyLanes lanes, each a
// drain.Lane on its own durable consumer (sources.JetStream, one shared
// connection, as the daemon wires them) of one stream in the run's embedded
// NATS server, each at manyRate under a backlog, with the daemon's precise
// waiter and one metrics registry. G1 is checked in every lane at departure
// (the instant the lane stamps on the message): every closed window of 1 s
// and of one interval holds at most floor(W × rate) + 1. CPU is the whole
// process's (getrusage: every lane and the NATS server) over the span.

// manyResult is one row of the section: the lanes on JetStream, or on
// in-memory sources (the lanes' own cost, no NATS).
type manyResult struct {
	source     string
	lanes      int
	rate       float64
	span       time.Duration
	departures int
	cpu        time.Duration
	load       float64
	bound1s    int
	boundIv    int
	worst1s    int           // most departures of one lane in a 1 s window
	worstIv    int           // … in a window of one interval
	over       int           // lanes with a window above its bound
	fewest10s  int           // fewest departures of one lane in a 10 s window; −1: span too short
	short      int           // lanes whose fewest is below longRunWant − longRunTol (G1's 0.5 %)
	lateP99    time.Duration // the lanes' departure lateness (all lanes' histograms merged)
	lateOver   float64       // share of departures later than (1 − min_spacing) of an interval
	minRate    float64
	maxRate    float64
	err        error
}

func (m manyResult) share() float64 { return m.cpu.Seconds() / m.span.Seconds() }

func (res *Results) runMany(ctx context.Context, env *natsEnv, logf func(string, ...any)) {
	p := res.plan
	for _, e := range []*natsEnv{env, nil} {
		m := runManyLanes(ctx, e, p.manyLanes, p.manyRate, p.manySpan, logf)
		res.many = append(res.many, m)
		if m.err != nil {
			res.problems = append(res.problems, "many lanes: "+m.err.Error())
			continue
		}
		logf("many lanes (%s): %d lanes at %g/s: %d departures, CPU %.1f %% of one core, worst windows %d/1 s, %d/interval, %d lane(s) over",
			m.source, m.lanes, m.rate, m.departures, 100*m.share(), m.worst1s, m.worstIv, m.over)
		if m.over > 0 {
			res.problems = append(res.problems, fmt.Sprintf("many lanes (%s): %d of %d lanes exceeded a G1 window (worst %d in 1 s, bound %d; %d in one interval, bound %d)",
				m.source, m.over, m.lanes, m.worst1s, m.bound1s, m.worstIv, m.boundIv))
		}
	}
}

// runManyLanes runs lanes lanes at rate for span on env, or on in-memory
// sources when env is nil.
func runManyLanes(ctx context.Context, env *natsEnv, lanes int, rate float64, span time.Duration, logf func(string, ...any)) manyResult {
	r := manyResult{source: "JetStream", lanes: lanes, rate: rate, span: span}
	// A backlog for the whole span and a little more in every lane.
	perLane := int(rate*span.Seconds()) + int(2*rate) + 5
	newSource := func(i int, cfg config.Lane) (drain.Source, error) { return newMemSource(perLane), nil }
	if env == nil {
		r.source = "in-memory"
	} else {
		if err := fillLanes(ctx, env, lanes, perLane, logf); err != nil {
			r.err = err
			return r
		}
		newSource = func(i int, cfg config.Lane) (drain.Source, error) {
			return sources.NewJetStream(ctx, env.js, sources.JetStreamConfig{
				Stream: manyStream, Subjects: cfg.Source.Subjects, Durable: cfg.Source.Consumer,
				AckWait: cfg.Source.AckWait, MaxAckPending: cfg.EffectiveMaxAckPending(),
			}, nil)
		}
	}
	reg := prometheus.NewRegistry()
	mm := metrics.New(reg)
	ls := make([]*drain.Lane, lanes)
	sinks := make([]*depSink, lanes)
	for i := range ls {
		name := "lane" + strconv.Itoa(i)
		consumer := "many-" + strconv.Itoa(i)
		if env != nil {
			consumer = env.consumerName("many")
		}
		cfg := laneConfig(manyStream, fmt.Sprintf("lanes.%d.>", i), consumer, rate, 0)
		src, err := newSource(i, cfg)
		if err != nil {
			r.err = err
			return r
		}
		sinks[i] = &depSink{}
		ls[i], err = drain.New(name, cfg, src, sinks[i], drain.WithMetrics(mm.Lane(name, rate)))
		if err != nil {
			r.err = err
			return r
		}
	}
	defer shaperGC()()
	measureMany(ctx, &r, ls, sinks)
	r.lateP99, r.lateOver = mergedLateness(reg, (1-shaper.DefaultMinSpacing)*shaper.Limit(rate).Interval().Seconds())
	return r
}

// mergedLateness merges every lane's shaper_departure_lateness_seconds of
// reg and returns its p99 (the upper bound of the bucket where the
// cumulative count passes 99 %) and the share of departures later than
// over seconds (counted from the first bucket bound at or above over): the
// make-up a lane has per departure, beyond which lateness costs rate.
func mergedLateness(reg *prometheus.Registry, over float64) (p99 time.Duration, share float64) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0
	}
	var bounds []float64
	var counts []uint64
	var total uint64
	for _, mf := range mfs {
		if mf.GetName() != metrics.LatenessName {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			total += h.GetSampleCount()
			for i, b := range h.GetBucket() {
				if len(bounds) <= i {
					bounds, counts = append(bounds, b.GetUpperBound()), append(counts, 0)
				}
				counts[i] += b.GetCumulativeCount()
			}
		}
	}
	if total == 0 {
		return 0, 0
	}
	p99 = -1
	for i, c := range counts {
		if p99 < 0 && float64(c) >= 0.99*float64(total) {
			p99 = time.Duration(bounds[i] * float64(time.Second))
		}
		if share == 0 && bounds[i] >= over-1e-12 {
			share = 1 - float64(c)/float64(total)
		}
	}
	if p99 < 0 { // beyond the last bucket
		p99 = time.Duration(bounds[len(bounds)-1] * float64(time.Second))
	}
	return p99, share
}

// manyStream is the stream of section 10, subjects lanes.<lane>.jobs.
const manyStream = "LANES"

// fillLanes publishes perLane messages for each of lanes lanes into
// manyStream.
func fillLanes(ctx context.Context, env *natsEnv, lanes, perLane int, logf func(string, ...any)) error {
	if err := sources.EnsureStream(ctx, env.js, manyStream, []string{"lanes.>"}); err != nil {
		return err
	}
	t0 := time.Now()
	data := make([]byte, payloadSize)
	for i := range perLane * lanes {
		lane := i % lanes
		msg := &nats.Msg{Subject: fmt.Sprintf("lanes.%d.jobs", lane), Data: data, Header: nats.Header{}}
		msg.Header.Set(shaper.MsgIDHeader, fmt.Sprintf("many-%d-%d", lane, i))
		if _, err := env.js.PublishMsgAsync(msg); err != nil {
			return err
		}
		if (i+1)%1000 == 0 {
			<-env.js.PublishAsyncComplete()
		}
	}
	<-env.js.PublishAsyncComplete()
	logf("many lanes: published %d messages in %s", perLane*lanes, time.Since(t0).Round(time.Millisecond))
	return nil
}

// measureMany starts the lanes, lets them depart for r.span, drains them
// and judges every lane's departures.
func measureMany(ctx context.Context, r *manyResult, ls []*drain.Lane, sinks []*depSink) {
	rate := r.rate
	m := startMeter()
	for _, l := range ls {
		l.Start()
	}
	time.Sleep(r.span)
	var e endToEnd
	m.stop(&e)
	r.span, r.load = e.elapsed, e.load
	r.cpu = cpuTime() - m.cpu0
	var wg sync.WaitGroup
	dctx, cancel := context.WithTimeout(ctx, 0) // stop departing now, hand the rest back
	for _, l := range ls {
		wg.Go(func() { l.Drain(dctx) })
	}
	wg.Wait()
	cancel()

	r.bound1s, r.boundIv = idealWindow(time.Second, rate), idealWindow(shaper.Limit(rate).Interval(), rate)
	r.minRate, r.fewest10s = math.Inf(1), math.MaxInt
	for _, s := range sinks {
		s.mu.Lock()
		deps := slices.Clone(s.dep)
		s.mu.Unlock()
		r.departures += len(deps)
		if len(deps) < 2 {
			r.err = fmt.Errorf("a lane departed %d messages", len(deps))
			return
		}
		w1, wiv, over := judgeLane(deps, rate)
		r.worst1s, r.worstIv = max(r.worst1s, w1), max(r.worstIv, wiv)
		if over {
			r.over++
		}
		want, tol := longRunWant(rate)
		if f := fewestInWindow(deps, longRunWindow); f >= 0 {
			r.fewest10s = min(r.fewest10s, f)
			if f < want-tol {
				r.short++
			}
		}
		got := float64(len(deps)-1) / deps[len(deps)-1].Sub(deps[0]).Seconds()
		r.minRate, r.maxRate = min(r.minRate, got), max(r.maxRate, got)
	}
	if r.fewest10s == math.MaxInt {
		r.fewest10s = -1
	}
}

// longRunWindow is the window of G1's long-run rate.
const longRunWindow = 10 * time.Second

// longRunWant is G1's long-run rate over longRunWindow at rate: limit × 10 s
// departures within 0.5 %, at least ±1 (a window of whole intervals holds one
// more), as section 8 counts it.
func longRunWant(rate float64) (want, tol int) {
	want = int(math.Round(rate * longRunWindow.Seconds()))
	return want, max(1, int(math.Floor(0.005*float64(want))))
}

// fewestInWindow returns the fewest of the sorted deps in a half-open window
// [d, d+w) starting at a departure d and ending before the last one; −1 when
// the departures span less than w.
func fewestInWindow(deps []time.Time, w time.Duration) int {
	fewest, j := -1, 0
	for i := range deps {
		if deps[i].Add(w).After(deps[len(deps)-1]) {
			break
		}
		for j < len(deps) && deps[j].Before(deps[i].Add(w)) {
			j++
		}
		if fewest < 0 || j-i < fewest {
			fewest = j - i
		}
	}
	return fewest
}

// judgeLane sorts one lane's departures and returns the most of them in a
// closed window of 1 s and of one interval at rate, and whether either is
// above floor(W × rate) + 1 (SPEC G1, slack 0; both windows are whole numbers
// of intervals when rate divides a second).
func judgeLane(deps []time.Time, rate float64) (w1, wiv int, over bool) {
	slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
	at := make([]time.Duration, len(deps))
	for i, d := range deps {
		at[i] = d.Sub(deps[0])
	}
	iv := shaper.Limit(rate).Interval()
	w1, wiv = maxInWindow(at, time.Second), maxInWindow(at, iv)
	return w1, wiv, w1 > idealWindow(time.Second, rate) || wiv > idealWindow(iv, rate)
}

// manyMarkdown renders section 10.
func (r *Results) manyMarkdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("## 10. Many lanes in one process\n\n")
	if len(r.many) == 0 {
		w("Not run.\n\n")
		return b.String()
	}
	p := r.plan
	w("%d lanes in this process, each a `drain.Lane` at %g/s with the daemon's precise waiter, defaults otherwise, and a\n", p.manyLanes, p.manyRate)
	w("backlog for the whole %s. *JetStream*: each lane on its own durable consumer (`sources.JetStream`, one shared\n", fmtSeconds(p.manySpan))
	w("connection, as the daemon wires them) of one stream in the embedded NATS server, whose CPU is in the\n")
	w("process's; *in-memory*: the same lanes on in-memory sources, the lanes' own cost. G1 is checked in every lane at\n")
	w("departure: the most departures of one lane in any closed window of 1 s and of one interval, against\n")
	w("`floor(W × rate) + 1` (a count above it is a failed measurement), and G1's long-run rate: the fewest\n")
	w("departures of one lane in any 10 s window (full runs; a lane short of `limit × 10 s` by more than 0.5 %%,\n")
	w("at least 1, is counted, as in section 8). *Lateness* merges the lanes' `shaper_departure_lateness_seconds`:\n")
	w("a departure later than (1 − min_spacing) of an interval is more than the pacer makes up, and costs rate.\n")
	w("CPU is the whole process's (getrusage) over the span.\n\n")
	want, tol := longRunWant(p.manyRate)
	t := table{head: []string{"source", "lanes", "rate /s each", "span", "departures", "lane rate min–max /s", "worst 1 s window", "bound",
		"worst 1-interval window", "bound", "lanes over", "fewest in 10 s", fmt.Sprintf("want %d ± %d", want, tol), "lanes short",
		"lateness p99 ms", fmt.Sprintf("late > %.0f ms", (1-shaper.DefaultMinSpacing)*shaper.Limit(p.manyRate).Interval().Seconds()*1000),
		"CPU s", "% of one core", "CPU µs/dep", "load %"}}
	for _, m := range r.many {
		if m.err != nil {
			t.add(m.source, strconv.Itoa(m.lanes), fmt.Sprintf("%g", m.rate), "failed: "+m.err.Error())
			continue
		}
		t.add(m.source, strconv.Itoa(m.lanes), fmt.Sprintf("%g", m.rate), fmtSeconds(m.span.Round(100*time.Millisecond)), strconv.Itoa(m.departures),
			fmt.Sprintf("%.2f–%.2f", m.minRate, m.maxRate), strconv.Itoa(m.worst1s), strconv.Itoa(m.bound1s),
			strconv.Itoa(m.worstIv), strconv.Itoa(m.boundIv), strconv.Itoa(m.over),
			fewest(m.fewest10s), fmt.Sprintf("≥ %d", want-tol), strconv.Itoa(m.short),
			fmt.Sprintf("%.1f", float64(m.lateP99)/float64(time.Millisecond)), fmtPct(100*m.lateOver)+" %",
			fmt.Sprintf("%.2f", m.cpu.Seconds()), fmt.Sprintf("%.1f", 100*m.share()),
			fmtUs(m.cpu/time.Duration(max(1, m.departures))), fmtLoad(m.load))
	}
	w("%s\n", t.String())
	for _, m := range r.many {
		if m.err == nil && m.source == "JetStream" && m.lateOver > 0.05 {
			w("In the JetStream row the departures were late beyond the make-up: the embedded NATS server runs in the\n")
			w("same process and competes with the lanes for the 2 cores (a CPU profile of this section, `-section lanes\n")
			w("-cpuprofile FILE`, showed most of the process's time in the server writing each consumer's state file);\n")
			w("the in-memory row is the lanes alone.\n\n")
		}
	}
	return b.String()
}

// fewest prints a fewest-in-10-s count, "–" when the span was shorter.
func fewest(n int) string {
	if n < 0 {
		return "–"
	}
	return strconv.Itoa(n)
}

// manyHeadlines are section 10's headlines.
func (r *Results) manyHeadlines() []string {
	var hs []string
	for _, m := range r.many {
		if m.err != nil {
			continue
		}
		held := "every lane held G1"
		if m.over > 0 {
			held = fmt.Sprintf("%d lane(s) exceeded G1", m.over)
		}
		long := ""
		if m.fewest10s >= 0 {
			want, tol := longRunWant(m.rate)
			long = fmt.Sprintf(", %d lane(s) short of the long-run rate (fewest %d in 10 s, want ≥ %d)", m.short, m.fewest10s, want-tol)
		}
		hs = append(hs, fmt.Sprintf("%d lanes at %g/s in one process (%s sources): %s (worst %d in 1 s, bound %d; %d in one interval, bound %d), each lane %.2f–%.2f/s%s; the process used %.1f %% of one core (%s µs per departure).",
			m.lanes, m.rate, m.source, held, m.worst1s, m.bound1s, m.worstIv, m.boundIv, m.minRate, m.maxRate, long, 100*m.share(), fmtUs(m.cpu/time.Duration(max(1, m.departures)))))
	}
	return hs
}
