package shaper

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The breaker of SPEC §3 on instants: a table of scripted runs, and a
// property test against a naive oracle over random runs (seed printed on
// failure; re-run one with -breaker.seed=N).

var (
	breakerSeed = flag.Uint64("breaker.seed", 0, "run only the breaker property run with this seed")
	breakerRuns = flag.Int("breaker.runs", 2000, "number of random runs in the breaker property test")
)

var bt0 = time.Unix(1_700_000_000, 0)

func at(ms int) time.Time { return bt0.Add(time.Duration(ms) * time.Millisecond) }

// step is one scripted call on a breaker and what it must answer.
type step struct {
	ms   int    // instant, ms after bt0
	op   string // "ok", "fail", "neutral", "gone" (Record), "probe-ok" … (Record of the probe), "depart", "gate", "reset"
	want string // state after ("closed", "open", "held"); for depart: "probe" or "plain"; for gate: "go", "wait@<ms>", "wait"
}

func runSteps(t *testing.T, cfg BreakerConfig, steps []step) {
	t.Helper()
	b := NewBreaker(cfg, bt0)
	for i, s := range steps {
		now := at(s.ms)
		var got string
		attempt := map[string]Attempt{"ok": AttemptSuccess, "fail": AttemptFailure, "neutral": AttemptNeutral, "gone": AttemptGone}
		switch op := s.op; {
		case op == "depart":
			got = "plain"
			if b.Depart(now) {
				got = "probe"
			}
		case op == "gate":
			wait, until := b.Gate(now)
			switch {
			case !wait:
				got = "go"
			case until.IsZero():
				got = "wait"
			default:
				got = fmt.Sprintf("wait@%d", until.Sub(bt0).Milliseconds())
			}
		case op == "reset":
			b.Reset(now)
			got = b.State().String()
		case strings.HasPrefix(op, "probe-"):
			b.Record(now, attempt[strings.TrimPrefix(op, "probe-")], true)
			got = b.State().String()
		default:
			a, ok := attempt[op]
			if !ok {
				t.Fatalf("step %d: unknown op %q", i, op)
			}
			b.Record(now, a, false)
			got = b.State().String()
		}
		if got != s.want {
			t.Fatalf("step %d (%d ms %s): got %s, want %s", i, s.ms, s.op, got, s.want)
		}
	}
}

// TestBreakerTable: the rules of SPEC §3 Breaker, one run each.
func TestBreakerTable(t *testing.T) {
	cfg := BreakerConfig{FailureRatio: 0.5, MinAttempts: 4, Window: 10 * time.Second, ProbeEvery: time.Second}
	for _, tc := range []struct {
		name  string
		cfg   BreakerConfig
		steps []step
	}{
		{"min_attempts: three failures of three do not open, the fourth does", cfg, []step{
			{0, "fail", "closed"}, {1, "fail", "closed"}, {2, "fail", "closed"}, {3, "gate", "go"},
			{4, "fail", "open"}, {5, "gate", "wait@1004"},
		}},
		{"ratio: 2 of 4 failed is 0.5 and opens", cfg, []step{
			{0, "ok", "closed"}, {1, "fail", "closed"}, {2, "ok", "closed"}, {3, "fail", "open"},
		}},
		{"ratio: 2 of 5 failed stays closed", cfg, []step{
			{0, "ok", "closed"}, {1, "ok", "closed"}, {2, "ok", "closed"}, {3, "fail", "closed"}, {4, "fail", "closed"},
			{5, "fail", "open"}, // 3 of 6
		}},
		{"window: attempts at or before t − window no longer count", cfg, []step{
			{0, "fail", "closed"}, {1, "fail", "closed"}, {2, "fail", "closed"},
			{10_000, "fail", "closed"}, // the one at 0 ended exactly window ago: out, 3 in (0.001, 10]
			{10_001, "fail", "closed"}, // the one at 1 is out too: 3 in
			{10_001, "fail", "open"},   // 4 in (0.001, 10.001]
		}},
		{"neutral answers count neither way", cfg, []step{
			{0, "fail", "closed"}, {1, "neutral", "closed"}, {2, "neutral", "closed"}, {3, "neutral", "closed"},
			{4, "fail", "closed"}, {5, "fail", "closed"}, {6, "fail", "open"},
		}},
		{"probe every probe_every, one in flight; a probe's failure keeps it open", cfg, []step{
			{0, "fail", "closed"}, {1, "fail", "closed"}, {2, "fail", "closed"}, {3, "fail", "open"},
			{500, "depart", "plain"}, {1002, "gate", "wait@1003"}, {1003, "gate", "go"},
			{1003, "depart", "probe"}, {1004, "gate", "wait"}, {1004, "depart", "plain"},
			{1100, "fail", "open"},          // a task from before the opening: not counted
			{1500, "probe-fail", "open"},    // the probe failed
			{1600, "gate", "wait@2003"},     // the next one probe_every after the last probe left
			{2003, "depart", "probe"},       //
			{5000, "gate", "wait"},          // still in flight (a slow probe)
			{5100, "probe-neutral", "open"}, // a 4xx probe keeps it open
			{5100, "gate", "go"},            // overdue: at once
			{5100, "depart", "probe"},       //
			{5200, "probe-ok", "closed"},    // a probe's success closes it
			{5201, "gate", "go"},            //
			{5201, "depart", "plain"},       //
			{5300, "fail", "closed"},        // the window was forgotten: one failure is not four
		}},
		{"a non-probe success does not close an open breaker", cfg, []step{
			{0, "fail", "closed"}, {1, "fail", "closed"}, {2, "fail", "closed"}, {3, "fail", "open"},
			{4, "ok", "open"}, {2000, "ok", "open"},
		}},
		{"410 holds at once, with no probes, until reset", cfg, []step{
			{0, "gone", "held"}, {1, "gate", "wait"}, {60_000, "gate", "wait"}, {60_000, "depart", "plain"},
			{60_001, "probe-ok", "held"}, {60_002, "ok", "held"}, {60_003, "reset", "closed"}, {60_004, "gate", "go"},
		}},
		{"410 while open turns it held; a probe in flight no longer closes it", cfg, []step{
			{0, "fail", "closed"}, {1, "fail", "closed"}, {2, "fail", "closed"}, {3, "fail", "open"},
			{1003, "depart", "probe"}, {1004, "gone", "held"}, {1005, "probe-ok", "held"}, {9000, "gate", "wait"},
		}},
		{"reset of an open breaker; the probe in flight then counts as an ordinary attempt", cfg, []step{
			{0, "fail", "closed"}, {1, "fail", "closed"}, {2, "fail", "closed"}, {3, "fail", "open"},
			{1003, "depart", "probe"}, {1100, "reset", "closed"}, {1200, "probe-fail", "closed"},
			{1201, "fail", "closed"}, {1202, "fail", "closed"}, {1203, "fail", "open"},
		}},
		{"ratio 1: only all-failed opens", BreakerConfig{FailureRatio: 1, MinAttempts: 2, Window: time.Second, ProbeEvery: time.Second}, []step{
			{0, "ok", "closed"}, {1, "fail", "closed"}, {2, "fail", "closed"},
			{1000, "fail", "open"}, // the success at 0 left the window: 3 of 3
		}},
		{"off: nothing opens, 410 holds nothing", BreakerConfig{MinAttempts: 1, Window: time.Second, ProbeEvery: time.Second}, []step{
			{0, "fail", "closed"}, {1, "fail", "closed"}, {2, "gone", "closed"}, {3, "gate", "go"},
		}},
		{"min_attempts 1 and a tenth: 1 of 10 opens (no float noise at 0.1)", BreakerConfig{FailureRatio: 0.1, MinAttempts: 1, Window: time.Minute, ProbeEvery: time.Second}, []step{
			{0, "ok", "closed"}, {1, "ok", "closed"}, {2, "ok", "closed"}, {3, "ok", "closed"}, {4, "ok", "closed"},
			{5, "ok", "closed"}, {6, "ok", "closed"}, {7, "ok", "closed"}, {8, "ok", "closed"}, {9, "fail", "open"},
		}},
		{"3 of 30 is a tenth", BreakerConfig{FailureRatio: 0.1, MinAttempts: 30, Window: time.Minute, ProbeEvery: time.Second},
			append(repeat(27, "ok", "closed"), step{27, "fail", "closed"}, step{28, "fail", "closed"}, step{29, "fail", "open"})},
	} {
		t.Run(tc.name, func(t *testing.T) { runSteps(t, tc.cfg, tc.steps) })
	}
}

func repeat(n int, op, want string) []step {
	var s []step
	for i := range n {
		s = append(s, step{i, op, want})
	}
	return s
}

// TestBreakerSetConfig: a reload applies in place; turning the breaker off
// closes it; a new probe_every applies from the last probe.
func TestBreakerSetConfig(t *testing.T) {
	cfg := BreakerConfig{FailureRatio: 1, MinAttempts: 2, Window: time.Minute, ProbeEvery: time.Second}
	b := NewBreaker(cfg, bt0)
	b.Record(at(0), AttemptFailure, false)
	b.Record(at(1), AttemptFailure, false)
	if b.State() != BreakerOpen {
		t.Fatal("not open")
	}
	cfg.ProbeEvery = 5 * time.Second
	if b.SetConfig(cfg, at(2)) {
		t.Fatal("a new probe_every closed it")
	}
	if _, until := b.Gate(at(2)); !until.Equal(at(5001)) {
		t.Errorf("next probe at %v after the reload, want 5.001 s (the opening + the new probe_every)", until.Sub(bt0))
	}
	cfg.FailureRatio = 0
	if !b.SetConfig(cfg, at(3)) || b.State() != BreakerClosed {
		t.Errorf("turning it off: state %s, want closed and reported", b.State())
	}
	cfg.FailureRatio = 1
	b.SetConfig(cfg, at(4))
	if st, _ := b.Record(at(5), AttemptFailure, false); st != BreakerClosed {
		t.Error("the failures from before the reload still count")
	}
}

// TestBreakerCounts: Counts reports the window at now, frozen while open.
func TestBreakerCounts(t *testing.T) {
	b := NewBreaker(BreakerConfig{FailureRatio: 0.75, MinAttempts: 4, Window: time.Second, ProbeEvery: time.Second}, bt0)
	b.Record(at(0), AttemptSuccess, false)
	b.Record(at(100), AttemptFailure, false)
	if n, f := b.Counts(at(999)); n != 2 || f != 1 {
		t.Errorf("counts %d/%d, want 2/1", n, f)
	}
	if n, f := b.Counts(at(1000)); n != 1 || f != 1 {
		t.Errorf("counts at 1 s %d/%d, want 1/1 (the success left)", n, f)
	}
	for ms := 200; ms <= 500; ms += 100 {
		b.Record(at(1000+ms), AttemptFailure, false)
	}
	if n, f := b.Counts(at(9000)); b.State() != BreakerOpen || n != 4 || f != 4 {
		t.Errorf("open %v, counts %d/%d later, want open, 4/4 as at the opening", b.State(), n, f)
	}
}

// oracle is the rule of SPEC §3 Breaker written the naive way: every
// counted attempt since the last close in a list, scanned on each judgment.
type oracle struct {
	cfg   BreakerConfig
	state BreakerState
	ends  []struct {
		at     time.Time
		failed bool
	}
	lastProbe time.Time // the opening, then the last probe
	inFlight  bool
}

func (o *oracle) record(now time.Time, a Attempt, probe bool) {
	if probe {
		o.inFlight = false
	}
	switch {
	case a == AttemptGone:
		o.state = BreakerHeld
	case o.state == BreakerOpen && probe && a == AttemptSuccess:
		o.state, o.ends = BreakerClosed, nil
	case o.state == BreakerClosed && (a == AttemptSuccess || a == AttemptFailure):
		o.ends = append(o.ends, struct {
			at     time.Time
			failed bool
		}{now, a == AttemptFailure})
		n, f := 0, 0
		for _, e := range o.ends {
			if e.at.After(now.Add(-o.cfg.Window)) && !e.at.After(now) {
				n++
				if e.failed {
					f++
				}
			}
		}
		if n >= o.cfg.MinAttempts && float64(f) >= o.cfg.FailureRatio*float64(n)-1e-9 {
			o.state, o.lastProbe = BreakerOpen, now
		}
	}
}

func (o *oracle) mayProbe(now time.Time) bool {
	return o.state == BreakerOpen && !o.inFlight && !now.Before(o.lastProbe.Add(o.cfg.ProbeEvery))
}

// TestBreakerProperty: random runs of departures, attempts of every kind
// (each departure's attempt ends after a random latency, probes included),
// resets and reloads of probe_every, against the oracle; and the invariants
// of SPEC §3 Breaker on the probes: never two in flight, never closer than
// probe_every, none while held, and no plain departure while open.
func TestBreakerProperty(t *testing.T) {
	runs := *breakerRuns
	if testing.Short() {
		runs /= 10
	}
	first := uint64(1)
	if *breakerSeed != 0 {
		first, runs = *breakerSeed, 1
	}
	var total runStats
	for seed := first; seed < first+uint64(runs); seed++ {
		msg, st := breakerRun(seed)
		if msg != "" {
			t.Fatalf("seed %d (re-run with -breaker.seed=%d): %s", seed, seed, msg)
		}
		total.opened += st.opened
		total.probes += st.probes
		total.closedByProbe += st.closedByProbe
		total.held += st.held
	}
	t.Logf("%d runs: %+v", runs, total)
	if runs > 100 && (total.opened == 0 || total.probes == 0 || total.closedByProbe == 0 || total.held == 0) {
		t.Errorf("the runs never reach some state (%+v): the property proves little", total)
	}
}

type runStats struct{ opened, probes, closedByProbe, held int }

func breakerRun(seed uint64) (string, runStats) {
	var st runStats
	rng := rand.New(rand.NewPCG(seed, 0xb4ea))
	cfg := BreakerConfig{
		FailureRatio: []float64{0.1, 0.25, 0.5, 0.75, 1}[rng.IntN(5)],
		MinAttempts:  1 + rng.IntN(10),
		Window:       time.Duration(1+rng.IntN(50)) * 100 * time.Millisecond,
		ProbeEvery:   time.Duration(1+rng.IntN(20)) * 100 * time.Millisecond,
	}
	b := NewBreaker(cfg, bt0)
	o := &oracle{cfg: cfg}
	type task struct {
		end   time.Time
		a     Attempt
		probe bool
	}
	var tasks []task
	now := bt0
	failP := rng.Float64()
	var lastProbe time.Time
	reloaded := false // probe_every changed since the last probe
	var log []string
	for i := 0; i < 400; i++ {
		now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		// Tasks that ended by now, in order of their end.
		for {
			j := -1
			for k, tk := range tasks {
				if !tk.end.After(now) && (j < 0 || tk.end.Before(tasks[j].end)) {
					j = k
				}
			}
			if j < 0 {
				break
			}
			tk := tasks[j]
			tasks = append(tasks[:j], tasks[j+1:]...)
			before := b.State()
			b.Record(tk.end, tk.a, tk.probe)
			switch after := b.State(); {
			case before != BreakerOpen && after == BreakerOpen:
				st.opened++
			case before != BreakerHeld && after == BreakerHeld:
				st.held++
			case before == BreakerOpen && after == BreakerClosed:
				st.closedByProbe++
			}
			o.record(tk.end, tk.a, tk.probe)
			log = append(log, fmt.Sprintf("%v end %s probe=%v -> %s", tk.end.Sub(bt0), tk.a, tk.probe, b.State()))
			if b.State() != o.state {
				return fmt.Sprintf("state %s, oracle %s; %s", b.State(), o.state, tail(log)), st
			}
		}
		switch r := rng.IntN(100); {
		case r < 2:
			b.Reset(now)
			if o.state != BreakerClosed { // a reset of a closed breaker changes nothing
				o.state, o.ends, o.inFlight = BreakerClosed, nil, false
			}
			log = append(log, fmt.Sprintf("%v reset", now.Sub(bt0)))
		case r < 4:
			cfg.ProbeEvery = time.Duration(1+rng.IntN(20)) * 100 * time.Millisecond
			b.SetConfig(cfg, now)
			o.cfg, reloaded = cfg, true
		default:
			wait, until := b.Gate(now)
			if want := o.state == BreakerClosed || o.mayProbe(now); wait == want {
				return fmt.Sprintf("%v gate wait=%v, oracle may leave=%v; %s", now.Sub(bt0), wait, want, tail(log)), st
			}
			if wait && !until.IsZero() && !until.Equal(o.lastProbe.Add(o.cfg.ProbeEvery)) {
				return fmt.Sprintf("gate until %v, oracle %v", until.Sub(bt0), o.lastProbe.Add(o.cfg.ProbeEvery).Sub(bt0)), st
			}
			if wait {
				continue // the loop waits: no departure
			}
			wantProbe := o.mayProbe(now)
			probe := b.Depart(now)
			if probe != wantProbe {
				return fmt.Sprintf("%v depart probe=%v, oracle %v; %s", now.Sub(bt0), probe, wantProbe, tail(log)), st
			}
			if probe {
				if o.state != BreakerOpen || o.inFlight {
					return "a probe while held or with one in flight", st
				}
				if !lastProbe.IsZero() && !reloaded && now.Sub(lastProbe) < cfg.ProbeEvery {
					return fmt.Sprintf("probes %v apart, probe_every %v", now.Sub(lastProbe), cfg.ProbeEvery), st
				}
				o.inFlight, o.lastProbe, lastProbe, reloaded = true, now, now, false
				st.probes++
			} else if o.state != BreakerClosed {
				return "a plain departure while open", st
			}
			a := AttemptSuccess
			switch u := rng.Float64(); {
			case u < failP:
				a = AttemptFailure
			case u < failP+0.05:
				a = AttemptNeutral
			case u < failP+0.052:
				a = AttemptGone
			}
			tasks = append(tasks, task{end: now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond), a: a, probe: probe})
		}
	}
	return "", st
}

func tail(log []string) string {
	if len(log) > 8 {
		log = log[len(log)-8:]
	}
	return strings.Join(log, "; ")
}
