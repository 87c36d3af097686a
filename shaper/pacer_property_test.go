package shaper

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper/shapertest"
)

// Property tests of SPEC G1 and G2 on the fake clock: thousands of random
// schedules, each with a seed printed on failure (re-run one with
// -pacer.seed=N). A schedule mixes arrivals in bursts and trickles, idle
// spells, stalls of full task slots, pauses, hot reloads (same rate, other
// rate, other slack), warmup, and waiter lateness drawn from the measured
// distribution of this machine's precise waiter (lateQuantiles).

var (
	pacerSeed      = flag.Uint64("pacer.seed", 0, "run only the property schedule with this seed")
	pacerSchedules = flag.Int("pacer.schedules", 3000, "number of random schedules in the property tests")
)

// lateQuantiles is the lateness of shaper's PreciseWaiter against its target
// on this machine (2 shared cores, a CPU hog on the other core), in µs, at
// the quantiles 0, 10, 50, 90, 99, 99.9 and 100 %, measured by `go run
// ./bench` section 7 (docs/BENCHMARKS.md; 1,000/s and 10,000/s beside the
// hog: p50 0.10–0.14, p90 5.3–6.2, p99 71–173, p99.9 471–1,722, max
// 4,949–7,002): about half the wake-ups on time to a fraction of a µs, a
// body to ~10 µs and a tail set by the load. Drawn by inverse transform
// with linear interpolation.
var lateQuantiles = []struct{ q, us float64 }{
	{0, 0}, {0.10, 0.08}, {0.50, 0.12}, {0.90, 6}, {0.99, 120}, {0.999, 1000}, {1, 6000},
}

func drawLateness(rng *rand.Rand) time.Duration {
	u := rng.Float64()
	for i := 1; i < len(lateQuantiles); i++ {
		a, b := lateQuantiles[i-1], lateQuantiles[i]
		if u <= b.q {
			f := (u - a.q) / (b.q - a.q)
			return time.Duration((a.us + f*(b.us-a.us)) * float64(time.Microsecond))
		}
	}
	return 0
}

// schedule is one random run of a pacer driven as the departure loop drives
// it: a message and a slot ready, Next, a late wake, Depart.
type schedule struct {
	seed       uint64
	limits     []float64 // rates the reloads move between; [0] at start
	slack      int
	minSpacing float64
	warmup     time.Duration
	slots      int
	n          int

	deps  []time.Time
	maxLm float64 // the highest limit in force during the run
	notes []string
}

func newSchedule(seed uint64) *schedule {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	rates := []float64{0.5, 1, 5, 30, 100, 250, 1000, 2000, 10000}
	s := &schedule{seed: seed, slots: 1 + rng.IntN(8)}
	s.limits = []float64{rates[rng.IntN(len(rates))]}
	if rng.IntN(3) == 0 {
		s.limits = append(s.limits, rates[rng.IntN(len(rates))])
	}
	if rng.IntN(3) == 0 {
		s.slack = rng.IntN(4)
	}
	switch rng.IntN(3) {
	case 0:
		s.minSpacing = 1
	case 1:
		s.minSpacing = DefaultMinSpacing
	default:
		s.minSpacing = 0.5 + rng.Float64()/2
	}
	if rng.IntN(4) == 0 {
		s.warmup = time.Duration(rng.IntN(20)+1) * time.Duration(float64(time.Second)/s.limits[0])
	}
	s.n = 200 + rng.IntN(800)
	return s
}

func (s *schedule) String() string {
	return fmt.Sprintf("seed %d: limits %v slack %d min_spacing %.3f warmup %v slots %d n %d %v",
		s.seed, s.limits, s.slack, s.minSpacing, s.warmup, s.slots, s.n, s.notes)
}

func (s *schedule) cfg(limit float64) PacerConfig {
	return PacerConfig{Limit: Limit(limit), Slack: s.slack, MinSpacing: s.minSpacing, WarmupPeriod: s.warmup, ColdFactor: 3}
}

// run drives the pacer through the schedule and records the departures.
func (s *schedule) run() {
	rng := rand.New(rand.NewPCG(s.seed, 0xdead))
	now := t0
	p := NewPacer(s.cfg(s.limits[0]), now)
	limit := s.limits[0]
	s.maxLm = limit
	iv := func() time.Duration { return Limit(limit).Interval() }
	// Arrivals: bursts and trickles with idle spells between them.
	var arrivals []time.Time
	at := now
	for len(arrivals) < s.n {
		switch rng.IntN(4) {
		case 0: // a burst
			for range 1 + rng.IntN(200) {
				arrivals = append(arrivals, at)
			}
		case 1: // a trickle below the rate
			for range 1 + rng.IntN(50) {
				at = at.Add(time.Duration(float64(iv()) * (1 + rng.Float64()*2)))
				arrivals = append(arrivals, at)
			}
		case 2: // an idle spell
			at = at.Add(time.Duration(float64(iv()) * rng.Float64() * 30))
		default: // a trickle above the rate (backlog builds)
			for range 1 + rng.IntN(50) {
				at = at.Add(time.Duration(float64(iv()) * rng.Float64() * 0.8))
				arrivals = append(arrivals, at)
			}
		}
	}
	arrivals = arrivals[:s.n]
	// Task slots: free at these instants.
	free := make([]time.Time, s.slots)
	for i := range free {
		free[i] = now
	}
	nextEvent := now.Add(time.Duration(float64(iv()) * (5 + rng.Float64()*50)))
	busy := false
	for k := 0; k < s.n; k++ {
		// The head message and a free slot.
		ready := now
		if arrivals[k].After(ready) {
			if busy {
				p.SetBusy(now, false)
				busy = false
			}
			ready = arrivals[k]
		}
		sort.Slice(free, func(i, j int) bool { return free[i].Before(free[j]) })
		if free[0].After(ready) {
			ready = free[0]
		}
		if !busy {
			p.SetBusy(ready, true)
			busy = true
		}
		now = ready
		var dep time.Time
		for {
			next := p.Next(now)
			d := next
			if next.After(now) {
				d = next.Add(drawLateness(rng))
			} else if rng.IntN(50) == 0 {
				d = next.Add(drawLateness(rng)) // the loop itself was slow
			}
			if rng.IntN(30) == 0 {
				// The process stalled (GC, a preempted thread, SIGSTOP)
				// for up to 3 intervals.
				d = d.Add(time.Duration(rng.Float64() * 3 * float64(iv())))
			}
			if nextEvent.After(d) {
				dep = d
				break
			}
			// An event during the wait wakes the loop (the lane's wake
			// channel): apply it and read Next again.
			now = maxTime(now, nextEvent)
			s.event(rng, p, now, &limit)
			s.maxLm = max(s.maxLm, limit)
			nextEvent = now.Add(time.Duration(float64(iv()) * (5 + rng.Float64()*100)))
		}
		p.Depart(ready, dep)
		s.deps = append(s.deps, dep)
		now = dep
		// The task holds its slot for a while; sometimes a long while
		// (a slow downstream: every slot busy, departures wait).
		hold := time.Duration(float64(iv()) * rng.Float64() * float64(s.slots))
		if rng.IntN(40) == 0 {
			hold = time.Duration(float64(iv()) * float64(s.slots) * (5 + rng.Float64()*20))
		}
		free[0] = dep.Add(hold)
	}
}

// event applies one of: a pause, a hot reload to the same rate, to another
// rate, or of the slack.
func (s *schedule) event(rng *rand.Rand, p *Pacer, now time.Time, limit *float64) {
	switch rng.IntN(4) {
	case 0:
		d := time.Duration(float64(Limit(*limit).Interval()) * rng.Float64() * 40)
		p.Pause(now.Add(d))
		s.notes = append(s.notes, "pause")
	case 1:
		p.SetConfig(s.cfg(*limit), now)
		s.notes = append(s.notes, "reload")
	case 2:
		*limit = s.limits[rng.IntN(len(s.limits))]
		p.SetConfig(s.cfg(*limit), now)
		s.notes = append(s.notes, fmt.Sprintf("reload %v/s", *limit))
	default:
		p.SetConfig(s.cfg(*limit), now)
		p.SetBusy(now, true)
		s.notes = append(s.notes, "warmup tick")
	}
	if len(s.notes) > 8 {
		s.notes = s.notes[len(s.notes)-8:]
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// check asserts SPEC G1's windows at the highest limit in force: whole
// numbers of intervals hold W × limit + 1 + slack, others
// floor(W × limit / min_spacing) + 1 + slack; above 1,000/s only windows of
// 1 ms or more. With one rate and slack 0 up to 1,000/s, consecutive
// departures keep min_spacing intervals.
func (s *schedule) check(t *testing.T) {
	t.Helper()
	lim := s.maxLm
	iv := Limit(lim).Interval()
	minW := iv
	if lim > SpacingMaxRate {
		minW = BatchWindow
	}
	for _, m := range []float64{1, 2, 3, 7, 10, 100, 1000} {
		w := time.Duration(m * float64(iv))
		if w < minW {
			continue
		}
		if got, want := maxInWindow(s.deps, w), int(m)+1+s.slack; got > want {
			t.Fatalf("%v\n%d departures in a window of %v intervals (%v), bound %d", s, got, m, w, want)
		}
	}
	for _, f := range []float64{0.5, 0.97, 1.5, 2.4, 3.9, 10.5, 15.25} {
		w := time.Duration(f * float64(iv))
		if w < minW {
			continue
		}
		want := int(math.Floor(f/s.minSpacing+1e-9)) + 1 + s.slack
		if got := maxInWindow(s.deps, w); got > want {
			t.Fatalf("%v\n%d departures in a window of %v intervals (%v), bound %d", s, got, f, w, want)
		}
	}
	if len(s.limits) == 1 && s.slack == 0 && lim <= SpacingMaxRate {
		floor := time.Duration(s.minSpacing * float64(iv))
		for i := 1; i < len(s.deps); i++ {
			if g := s.deps[i].Sub(s.deps[i-1]); g < floor-time.Nanosecond {
				t.Fatalf("%v\ngap %d = %v < min_spacing × interval = %v", s, i, g, floor)
			}
		}
	}
}

// TestPacerPropertyWindows: G1's windows and spacing, and G2 (no credit
// beyond the slack from idle time, pauses, stalls of full slots, reloads or
// warmup), over random schedules.
func TestPacerPropertyWindows(t *testing.T) {
	if *pacerSeed != 0 {
		s := newSchedule(*pacerSeed)
		s.run()
		s.check(t)
		return
	}
	n := *pacerSchedules
	if testing.Short() {
		n /= 10
	}
	for seed := uint64(1); seed <= uint64(n); seed++ {
		s := newSchedule(seed)
		s.run()
		s.check(t)
	}
}

// TestPacerLongRunRateUnderLateness: SPEC G1's long-run rate. Under a
// backlog, with the waiter's measured lateness (lateQuantiles), every 10 s
// holds limit × 10 s within 0.5 % at the default min_spacing, from 0.5/s to
// 1,000/s, and never more than the limit at any rate. Above 1,000/s the
// measured tail (1 % of wake-ups later than 120 µs, 0.1 % later than 1 ms)
// is longer than the interval, and lateness beyond one interval cannot be
// made up without a burst: 5,000/s and 10,000/s fall 2–4 % short with this
// distribution (logged, not asserted; docs/BENCHMARKS.md). With
// min_spacing 1.0 lateness cannot be made up at all.
func TestPacerLongRunRateUnderLateness(t *testing.T) {
	for _, limit := range []float64{0.5, 1, 100, 1000, 5000, 10000} {
		for _, ms := range []float64{DefaultMinSpacing, 1} {
			seed := uint64(limit*1000) + uint64(ms*7)
			rng := rand.New(rand.NewPCG(seed, 1))
			p := NewPacer(PacerConfig{Limit: Limit(limit), MinSpacing: ms}, t0)
			span := 10 * time.Second
			if limit < 1 {
				span = 60 * time.Second
			} else if limit == 1 {
				span = 60 * time.Second
			}
			s := &sim{p: p, now: t0, late: func(int) time.Duration { return drawLateness(rng) }}
			want := int(limit * span.Seconds())
			deps := s.run(3 * want)
			// Every span of the run (from each of 20 starting points).
			for i := 0; i < 20; i++ {
				from := deps[i*len(deps)/40].Add(0)
				to := from.Add(span)
				got := 0
				for _, d := range deps {
					if !d.Before(from) && d.Before(to) {
						got++
					}
				}
				rate := float64(got) / span.Seconds()
				short := (limit - rate) / limit
				switch {
				case ms < 1 && limit > SpacingMaxRate && i == 0:
					t.Logf("limit %v/s min_spacing %v: %d departures in %v (%.2f %% short)", limit, ms, got, span, 100*short)
				case ms < 1 && limit <= SpacingMaxRate && math.Abs(short) > 0.005 && math.Abs(float64(got-want)) > 1:
					t.Fatalf("seed %d limit %v/s min_spacing %v: %d departures in %v (%.3f/s), want %d within 0.5 %%",
						seed, limit, ms, got, span, rate, want)
				case rate > limit*1.005 && got > want+1:
					t.Fatalf("seed %d limit %v/s min_spacing %v: %.3f/s above the limit", seed, limit, ms, rate)
				}
			}
		}
	}
}

// TestPacerMinSpacingOneNeverEarly: with min_spacing 1.0 two departures are
// never closer than one interval, however late the waiter.
func TestPacerMinSpacingOneNeverEarly(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 42))
	for _, limit := range []float64{10, 100, 1000} {
		p := NewPacer(PacerConfig{Limit: Limit(limit), MinSpacing: 1}, t0)
		s := &sim{p: p, now: t0, late: func(int) time.Duration { return drawLateness(rng) }}
		deps := s.run(5000)
		if g, iv := minGap(deps), Limit(limit).Interval(); g < iv {
			t.Errorf("limit %v/s min_spacing 1: gap %v < interval %v", limit, g, iv)
		}
	}
}

// TestPacerMakeUpIsSpaced: a waiter 3 % of an interval late at every
// departure (above the old 1 % make-up) costs no rate at 1,000/s with the
// default min_spacing, and the make-up never brings two departures closer
// than 0.95 intervals.
func TestPacerMakeUpIsSpaced(t *testing.T) {
	p := NewPacer(PacerConfig{Limit: 1000}, t0)
	rng := rand.New(rand.NewPCG(3, 3))
	s := &sim{p: p, now: t0, late: func(int) time.Duration {
		return time.Duration(rng.Int64N(int64(60 * time.Microsecond))) // mean 30 µs
	}}
	deps := s.run(20001)
	rate := 20000 / deps[20000].Sub(deps[0]).Seconds()
	if math.Abs(rate-1000)/1000 > 0.005 {
		t.Errorf("rate %.2f/s with 30 µs mean lateness, want 1000 within 0.5 %%", rate)
	}
	if g := minGap(deps); g < 950*time.Microsecond {
		t.Errorf("min gap %v < 0.95 ms", g)
	}
}

// TestPacerReloadEarnsNoCredit: SPEC G2 — a hot reload earns no credit. At
// 100/s with slack 2 under a backlog, reloads every 100 ms (the same
// configuration, a raised slack, a rate change and back) never release
// departures early: after the first 1 + slack, every 2 s window holds at most
// 2 × 100 + 1 + 2 = 203 and no gap after the start is below the interval.
func TestPacerReloadEarnsNoCredit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reload func(p *Pacer, now time.Time, i int)
	}{
		{"same config", func(p *Pacer, now time.Time, _ int) {
			p.SetConfig(PacerConfig{Limit: 100, Slack: 2}, now)
		}},
		{"slack raised from 0", func(p *Pacer, now time.Time, i int) {
			p.SetConfig(PacerConfig{Limit: 100, Slack: 2 * (i % 2)}, now)
		}},
		{"rate 100 → 50 → 100", func(p *Pacer, now time.Time, i int) {
			p.SetConfig(PacerConfig{Limit: Limit(100 - 50*(i%2)), Slack: 2}, now)
		}},
		{"fallback: Rebase at the same rate", func(p *Pacer, now time.Time, _ int) {
			p.SetConfig(PacerConfig{Limit: 100, Slack: 2}, now)
			p.Rebase(now)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPacer(PacerConfig{Limit: 100, Slack: 2}, t0)
			var deps []time.Time
			now := t0
			nextReload := t0.Add(100 * time.Millisecond)
			for i := 0; len(deps) < 1000; {
				at := p.Next(now)
				if !at.Before(nextReload) {
					now = nextReload
					tc.reload(p, now, i)
					i++
					nextReload = nextReload.Add(100 * time.Millisecond)
					continue
				}
				p.Depart(now, at)
				deps = append(deps, at)
				now = at
			}
			if got := maxInWindow(deps, 2*time.Second); got > 203 {
				t.Errorf("%d departures in a 2 s window, bound 203", got)
			}
			for i := 4; i < len(deps); i++ {
				if g := deps[i].Sub(deps[i-1]); g < 10*time.Millisecond-time.Microsecond {
					t.Fatalf("gap %d = %v after a reload: credit re-granted", i, g)
				}
			}
		})
	}
}

// TestPacerPauseAndStallEarnAtMostSlack: SPEC G2 — a pause, or waiting on
// full task slots, earns at most the slack: afterwards 1 + slack may leave at
// once, never more, and then the rate.
func TestPacerPauseAndStallEarnAtMostSlack(t *testing.T) {
	for _, slack := range []int{0, 3} {
		p := NewPacer(PacerConfig{Limit: 10, Slack: slack}, t0)
		now := t0
		for range 50 { // backlog: the credit is spent
			at := p.Next(now)
			p.Depart(now, at)
			now = at
		}
		p.Pause(now.Add(30 * time.Second))
		var deps []time.Time
		for range 20 {
			at := p.Next(now)
			p.Depart(now, at)
			deps = append(deps, at)
			now = at
		}
		burst := 0
		for _, d := range deps {
			if d.Equal(deps[0]) {
				burst++
			}
		}
		if burst != 1+slack {
			t.Errorf("slack %d: %d departures at the end of the pause, want %d", slack, burst, 1+slack)
		}
		if g := deps[slack+1].Sub(deps[slack]); g < 100*time.Millisecond-time.Microsecond {
			t.Errorf("slack %d: gap after the burst %v, want one interval", slack, g)
		}
	}
}

// TestPacerWindowsHoldAtTheWire: SPEC G1's bounds hold for what reaches the
// downstream. A lane whose sink reports the wire (shaper.WithWire) departs
// at 200/s and 1,000/s under a backlog with the waiter's measured lateness;
// the process stalls now and then for about an interval, and each request
// reaches the wire after 150 ± 50 µs, sometimes 300 µs later or 100 µs
// sooner, and now and then gets stuck for 3 ms. At the wire every 1 s window
// holds at most limit + 1 (at 200/s a make-up lag of up to one interval let
// 202 through once 0.4 ms of jitter compressed 202 departures that spanned
// just over 1 s: found by the chaos ledgers at kernel timestamps), and at
// 200/s the rate holds within 0.5 %.
func TestPacerWindowsHoldAtTheWire(t *testing.T) {
	for _, limit := range []float64{200, 1000} {
		for seed := uint64(1); seed <= 5; seed++ {
			rng := rand.New(rand.NewPCG(seed, uint64(limit)))
			p := NewPacer(PacerConfig{Limit: Limit(limit)}, t0)
			now, ready := t0, t0
			var wires []time.Time
			n := int(limit * 20)
			for range n {
				at := p.Next(now)
				dep := at
				if at.After(now) {
					dep = at.Add(drawLateness(rng))
				}
				if rng.IntN(200) == 0 { // a stall of the process: 0.6–1.6 intervals
					dep = dep.Add(time.Duration((0.6 + rng.Float64()) * float64(Limit(limit).Interval())))
				}
				p.Depart(ready, dep)
				// Departure → wire: usually 150 ± 50 µs, 8 % of requests 300 µs
				// slower, 2 % 100 µs faster, 0.2 % stuck for 3 ms.
				d := 100*time.Microsecond + time.Duration(rng.Int64N(int64(100*time.Microsecond)))
				switch r := rng.IntN(1000); {
				case r < 2:
					d = 3 * time.Millisecond
				case r < 22:
					d = 50 * time.Microsecond
				case r < 102:
					d += 300 * time.Microsecond
				}
				w := dep.Add(d)
				p.Wire(dep, w, false)
				wires = append(wires, w)
				// The next message and slot are ready at once (backlog); the
				// lane then waits for this request's wire before it reads
				// the pacer again (drain.WireReporter).
				ready, now = dep, w
			}
			sort.Slice(wires, func(i, j int) bool { return wires[i].Before(wires[j]) })
			if got, want := maxInWindow(wires, time.Second), int(limit)+1; got > want {
				t.Errorf("limit %v/s seed %d: %d requests in a 1 s window at the wire, bound %d", limit, seed, got, want)
			}
			// The rate, at 200/s: at 1,000/s this wire model's stuck requests
			// (the lane waits for each one's write) and its +300 µs requests
			// cost 1–1.5 % whatever the pacer does; what a real HTTP sink
			// achieves there is measured end to end in package sinks.
			rate := float64(n-1) / wires[n-1].Sub(wires[0]).Seconds()
			if limit == 1000 {
				t.Logf("limit %v/s seed %d: %.2f/s at the wire", limit, seed, rate)
			} else if math.Abs(rate-limit)/limit > 0.005 {
				t.Errorf("limit %v/s seed %d: %.2f/s at the wire, want within 0.5 %%", limit, seed, rate)
			}
		}
	}
}

// TestPacerWindowsHoldWhenTheWireGetsFaster: at 5,000/s, where the lane
// makes up lateness most of the time, the delay from departure to wire
// moves between a slow spell (60–120 µs) and a fast one (35–45 µs), as the
// bench's section 11 recorded when a 10 ms window at the downstream held
// 52 (G1: 51). The make-up's lag judged against the usual delay let a
// request at the lag's end and, 51 intervals later, a fast one span under
// 10 ms; judged against the whole delay (Pacer.Wire, above 1,000/s) every
// window of 1 ms, 10 ms, 100 ms and 1 s holds W × limit + 1 at the wire.
//
// Seeds 21–40 start with a slow spell of 20–120 requests, as a run starts
// while the pool dials its connections. Judged against the quickest delay
// seen (the rule of sessions 18–24), the slow spell's quickest was too slow
// for the requests after it, and a 10 ms window at the downstream held 52
// in 2 runs of 4 of the bench's section 11. Judged against 60 µs (more
// than the fast spell's delay) those seeds fail; against the usual delay,
// the first 20 do.
func TestPacerWindowsHoldWhenTheWireGetsFaster(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0xfa57))
		slow := true
		firstSpell := 0 // seeds 21–40: the run starts slow for this many requests
		if seed > 20 {
			firstSpell = 20 + rng.IntN(100)
		}
		wires := wireRun(rng, false, 100, func(i int) {
			switch {
			case i < firstSpell:
			case i == firstSpell && firstSpell > 0:
				slow = false
			case i%(100+rng.IntN(400)) == 0:
				slow = !slow
			}
		}, func(_, _ time.Time) time.Duration {
			if slow {
				return 60*time.Microsecond + time.Duration(rng.Int64N(int64(60*time.Microsecond)))
			}
			return 35*time.Microsecond + time.Duration(rng.Int64N(int64(10*time.Microsecond)))
		})
		checkWireWindows(t, seed, wires)
	}
}

// TestPacerWireTilesHoldTheWindows: above 1,000/s a request whose report
// is exact may reach the wire up to a whole interval after its schedule's
// time (the tiles of Pacer.Wire). At 5,000/s, with departures as late as the waiter makes them
// and a delay to the wire that is now and then almost nothing (1–5 µs)
// right after one that used the whole interval, every window of 1 ms,
// 10 ms, 100 ms and 1 s holds W × limit + 1 at the wire, in 40 random runs
// (seeds 1–40). With a lag of 1.05 intervals a 1 ms window held 7 (bound 6)
// in all 40 runs, and a 10 ms window 52 (bound 51) in 39.
func TestPacerWireTilesHoldTheWindows(t *testing.T) {
	iv := Limit(wireRunLimit).Interval()
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x711e5))
		wires := wireRun(rng, true, 50, func(int) {}, func(at, dep time.Time) time.Duration {
			var d time.Duration
			switch r := rng.IntN(100); {
			case r < 20: // almost nothing
				d = time.Microsecond + time.Duration(rng.Int64N(int64(4*time.Microsecond)))
			case r < 40: // up to the end of the interval, or just past it
				d = at.Add(iv).Sub(dep) - 3*time.Microsecond + time.Duration(rng.Int64N(int64(6*time.Microsecond)))
			case r < 41: // stuck
				d = time.Duration(500+rng.IntN(2500)) * time.Microsecond
			default:
				d = 20*time.Microsecond + time.Duration(rng.Int64N(int64(100*time.Microsecond)))
			}
			return max(d, time.Microsecond)
		})
		checkWireWindows(t, seed, wires)
	}
}

// wireRunLimit is the rate of wireRun, in messages per second.
const wireRunLimit = 5000

// wireRun drives a pacer at wireRunLimit for 20,000 departures as a lane
// under a backlog drives it with a sink that reports the wire
// (drain.WireReporter): each departure is as late as the waiter makes it
// (drawLateness), and one in lateOneIn up to an interval later still (the
// lane makes that up); no departure is due before the span floor
// (WireFloor: the lane's sink gates its writes); its request reaches the
// wire delay(at, dep) after it left (at: when it was due), reported exact
// or not (shaper.WithWire); the
// lane reads the pacer again after the wire report. step(i) runs before
// departure i. It returns the wire
// instants, sorted.
func wireRun(rng *rand.Rand, exact bool, lateOneIn int, step func(i int), delay func(at, dep time.Time) time.Duration) []time.Time {
	iv := Limit(wireRunLimit).Interval()
	p := NewPacer(PacerConfig{Limit: wireRunLimit}, t0)
	now, ready := t0, t0
	var wires []time.Time
	for i := range 20000 {
		step(i)
		// A lane whose sink gates its writes departs no earlier than the
		// span floor (drain.Lane.departureAt).
		at := p.Next(now)
		if f := p.WireFloor(now); f.After(at) {
			at = f
		}
		dep := at
		if at.After(now) {
			dep = at.Add(drawLateness(rng))
		}
		if rng.IntN(lateOneIn) == 0 {
			dep = dep.Add(time.Duration(rng.Float64() * float64(iv)))
		}
		p.Depart(ready, dep)
		w := dep.Add(delay(at, dep))
		p.Wire(dep, w, exact)
		wires = append(wires, w)
		ready, now = dep, w
	}
	sort.Slice(wires, func(i, j int) bool { return wires[i].Before(wires[j]) })
	return wires
}

// checkWireWindows reports every window of 1 ms, 10 ms, 100 ms and 1 s
// among wires (sorted) holding more than W × wireRunLimit + 1, and every
// window of another length W ≥ 1 ms (5.03 to 50.5 intervals) holding more
// than floor(W × wireRunLimit / min_spacing) + 1 (SPEC G1).
func checkWireWindows(t *testing.T, seed uint64, wires []time.Time) {
	t.Helper()
	iv := Limit(wireRunLimit).Interval()
	for _, win := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second} {
		if got, want := maxInWindow(wires, win), int(win/iv)+1; got > want {
			t.Errorf("seed %d: %d requests in a %v window at the wire, bound %d", seed, got, win, want)
		}
	}
	for _, f := range []float64{5.03, 5.2, 5.5, 6.3, 7.5, 9.9, 10.5, 15.25, 19.5, 50.5} {
		win := time.Duration(f * float64(iv))
		want := shapertest.BoundAny(win, wireRunLimit, 0, DefaultMinSpacing)
		if got := maxInWindow(wires, win); got > want {
			t.Errorf("seed %d: %d requests in a window of %.2f intervals (%v) at the wire, bound %d", seed, got, f, win, want)
		}
	}
}

// TestSlotMakeUp: the make-up of a shared schedule keeps the spacing floor
// slot to slot up to 1,000/s ((1 − s) intervals: 0.5 ms at 100/s) and the
// window-based lag above (55 µs at 10,000/s, 75 µs at 2,000/s); the
// tolerance adds the slack's credit.
func TestSlotMakeUp(t *testing.T) {
	for _, tc := range []struct {
		limit float64
		slack int
		want  time.Duration
	}{
		{100, 0, 500 * time.Microsecond},
		{1000, 0, 50 * time.Microsecond},
		{2000, 0, 75 * time.Microsecond},
		{10000, 0, 55 * time.Microsecond},
		{100, 2, 20500 * time.Microsecond},
	} {
		iv := Limit(tc.limit).Interval()
		if got := SlotTolerance(iv, tc.slack, DefaultMinSpacing); (got - tc.want).Abs() > time.Microsecond {
			t.Errorf("%v/s slack %d: tolerance %v, want %v", tc.limit, tc.slack, got, tc.want)
		}
	}
	if got := SlotMakeUp(time.Millisecond, 1); got != 0 {
		t.Errorf("min_spacing 1: make-up %v, want 0", got)
	}
}

// TestPacerReloadFromSlowRateEarnsNoMakeUp: a backlog held 2.5 s at 1/h by
// a reload, then reloaded back to 100/s, resumes with gaps of exactly one
// interval: the wait on the slow schedule is not lateness to make up.
func TestPacerReloadFromSlowRateEarnsNoMakeUp(t *testing.T) {
	p := NewPacer(PacerConfig{Limit: 100}, t0)
	now := t0
	p.SetBusy(now, true)
	for range 100 {
		at := p.Next(now)
		p.Depart(now, at)
		now = at
	}
	ready := now
	p.SetConfig(PacerConfig{Limit: Limit(1.0 / 3600)}, now)
	now = now.Add(2500 * time.Millisecond)
	p.SetConfig(PacerConfig{Limit: 100}, now)
	prev := time.Time{}
	for i := range 50 {
		at := p.Next(now)
		p.Depart(ready, at)
		if !prev.IsZero() {
			if g := at.Sub(prev); g < 10*time.Millisecond-time.Microsecond {
				t.Fatalf("gap %d after the reload back = %v, want 10ms (no make-up)", i, g)
			}
		}
		prev, now, ready = at, at, at
	}
}
