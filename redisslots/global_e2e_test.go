package redisslots

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/internal/testserver"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources"
)

// arrivals records when the downstream saw each message, and when it
// departed from its lane.
type arrivals struct {
	mu  sync.Mutex
	at  []time.Time
	dep []time.Time
	ids map[string]int
}

func (a *arrivals) Send(_ context.Context, m *shaper.Message) error {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = append(a.at, now)
	a.dep = append(a.dep, m.Departed)
	a.ids[string(m.Data)]++
	return nil
}

// snapshot returns the arrivals and the departures, sorted, and the number
// of distinct messages.
func (a *arrivals) snapshot() (arr, dep []time.Time, unique int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sorted := func(ts []time.Time) []time.Time {
		ts = slices.Clone(ts)
		slices.SortFunc(ts, func(x, y time.Time) int { return x.Compare(y) })
		return ts
	}
	return sorted(a.at), sorted(a.dep), len(a.ids)
}

// maxWithin returns the largest number of sorted instants in a closed
// window [x, x+w] that lies within [from, to].
func maxWithin(ts []time.Time, w time.Duration, from, to time.Time) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) > w {
			j++
		}
		// Windows ending at ts[i]: the earliest start is ts[i]-w.
		if ts[i].Before(from.Add(w)) || ts[i].After(to) {
			continue
		}
		k := j
		for ts[k].Before(from) {
			k++
		}
		best = max(best, i-k+1)
	}
	return best
}

// transitions counts the fallback transitions a lane logs.
type transitions struct {
	mu               sync.Mutex
	warned, restored int
}

func (h *transitions) Enabled(context.Context, slog.Level) bool { return true }
func (h *transitions) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case r.Level == slog.LevelWarn && strings.HasPrefix(r.Message, "global rate unavailable"):
		h.warned++
	case strings.HasPrefix(r.Message, "global rate restored"):
		h.restored++
	}
	return nil
}
func (h *transitions) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *transitions) WithGroup(string) slog.Handler      { return h }

// TestGlobalThreeReplicas is issue 5's proof in one process: three
// replicas of one lane — each with its own NATS connection and Redis
// client, all on one durable JetStream consumer of a real (embedded) NATS
// server and one real redis-server — share limit 150/s over 3,000
// messages. Redis is killed for 5 s in the middle. Expected (allowances in
// docs/scaling.md):
//   - on the shared schedule, at most 151 departures in any 1 s window
//     (SPEC G1 across replicas), and 151 + 1 at the downstream (the
//     departure → request jitter, which replicas cannot correct for one
//     another);
//   - during the outage and the transitions, the three local fallbacks at
//     50/s each: the aggregate rate stays ≤ 150/s, windows ≤ 3 × (50 + 1);
//   - an aggregate within 1 % of 150/s on the shared schedule, every
//     message delivered exactly once, nothing pending;
//   - the fallback gauge 1 during the outage, 0 within 2 s after, and one
//     log line per transition.
func TestGlobalThreeReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("20 s end-to-end test")
	}
	const (
		limit    = 150
		replicas = 3
		total    = 3000
	)
	rd := startRedis(t)
	ns := testserver.NATS(t)
	ctx := context.Background()

	cfg := config.Lane{
		Source: config.Source{Stream: "JOBS", Subjects: []string{"jobs.>"}, Consumer: "shaper-payments",
			AckWait: 30 * time.Second, MaxDeliver: 5, MaxAckPending: replicas * (100 + 8)},
		Bucket: config.Bucket{Capacity: 100, Overflow: config.OverflowBlock},
		Rate:   config.Rate{Limit: limit, Global: true, Warmup: config.Warmup{ColdFactor: 3}},
		Task: config.Task{Timeout: 5 * time.Second, MaxInFlight: 8,
			Retry: config.Retry{Backoff: []time.Duration{time.Second}, RetryAfter: true, MaxDelay: time.Minute}},
		DeadLetter: config.DeadLetter{Subject: "shaper.dead.payments"},
		Sink:       config.Sink{Kind: config.SinkLog},
	}
	down := &arrivals{ids: map[string]int{}}
	type replica struct {
		lane *drain.Lane
		m    *metrics.Lane
		log  *transitions
	}
	var reps []replica
	var js0 jetstream.JetStream
	for i := range replicas {
		nc, err := sources.Connect(ns.ClientURL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			js0 = js
		}
		src, err := sources.NewJetStream(ctx, js, sources.JetStreamConfig{Stream: cfg.Source.Stream, Subjects: cfg.Source.Subjects,
			Durable: cfg.Source.Consumer, AckWait: cfg.Source.AckWait, MaxAckPending: cfg.Source.MaxAckPending}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// A timeout above the 50 ms default: this test runs beside others
		// on two shared cores under -race, where a stall of 50 ms is not
		// rare, and a replica that falls back while the others still reach
		// Redis adds its fallback rate on top of the limit (a partial
		// outage, docs/scaling.md). The outage here is a killed server:
		// refused connections, detected at once whatever the timeout.
		rs, err := NewRedisSlots(config.Redis{Addr: rd.Addr, KeyPrefix: "e2e", Timeout: 250 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		m := metrics.New(prometheus.NewRegistry()).Lane("payments", float64(cfg.Rate.Limit))
		tr := &transitions{}
		lane, err := drain.New("payments", cfg, src, down, drain.WithMetrics(m), drain.WithLogger(slog.New(tr)),
			drain.WithGlobal(rs.Lane("payments"), replicas))
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, replica{lane: lane, m: m, log: tr})
	}
	for i := range total {
		if _, err := js0.Publish(ctx, fmt.Sprintf("jobs.%d", i%7), fmt.Appendf(nil, "job-%d", i)); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	for _, r := range reps {
		r.lane.Start()
	}
	gauges := func() (fb []float64) {
		for _, r := range reps {
			fb = append(fb, testutil.ToFloat64(r.m.Fallback))
		}
		return fb
	}
	// What the replicas report of the slots they lost, sampled every 20 ms
	// (slotLedger): the shortfall of each phase must be accounted for.
	var ms []*metrics.Lane
	for _, r := range reps {
		ms = append(ms, r.m)
	}
	ledger := startSlotLedger(ms)
	defer ledger.stop()
	sleepUntil(at(6))
	rd.Kill()
	killed := time.Now()
	sleepUntil(at(8.5))
	during := gauges()
	sleepUntil(at(11))
	rd.Start()
	restarted := time.Now()
	sleepUntil(restarted.Add(2 * time.Second))
	after := gauges()
	for time.Since(start) < 45*time.Second {
		if _, _, n := down.snapshot(); n >= total {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	for _, r := range reps {
		r.lane.Drain(dctx)
	}
	cancel()

	ts, deps, unique := down.snapshot()
	if unique != total || len(ts) != total {
		t.Errorf("downstream saw %d calls for %d distinct messages, want %d each", len(ts), unique, total)
	}
	info, err := js0.Consumer(ctx, cfg.Source.Stream, cfg.Source.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if ci, err := info.Info(ctx); err != nil || ci.NumAckPending != 0 || ci.NumPending != 0 {
		t.Errorf("consumer after the run: %+v, %v; want nothing pending", ci, err)
	}
	rateIn := func(from, to time.Time) (float64, int) {
		var in []time.Time
		for _, x := range ts {
			if !x.Before(from) && x.Before(to) {
				in = append(in, x)
			}
		}
		if len(in) < 2 {
			return 0, len(in)
		}
		return float64(len(in)-1) / in[len(in)-1].Sub(in[0]).Seconds(), len(in)
	}
	// On the shared schedule: before the kill, and from 3.5 s after the
	// restart (every replica back within a probe interval, plus the grace
	// at limit / replicas_hint).
	back := restarted.Add(3500 * time.Millisecond)
	end := ts[len(ts)-1].Add(-500 * time.Millisecond)
	// From 1.5 s: the first second holds the replicas' clock sync and the
	// waiters' first estimates of their wake-up latency, where a late
	// wake-up drops its slot (33 of the drops of one run were there).
	g1, n1 := rateIn(at(1.5), killed)
	out, n2 := rateIn(killed.Add(100*time.Millisecond), restarted)
	g2, n3 := rateIn(back, end)
	overall := float64(len(ts)-1) / ts[len(ts)-1].Sub(ts[0]).Seconds()
	sec := time.Second
	depGlobal := max(maxWithin(deps, sec, start, killed), maxWithin(deps, sec, back, deps[len(deps)-1]))
	arrGlobal := max(maxWithin(ts, sec, start, killed), maxWithin(ts, sec, back, ts[len(ts)-1]))
	depAll, arrAll := maxInClosed(deps, sec), maxInClosed(ts, sec)
	t.Logf("shared schedule before the outage: %.2f/s (%d); outage: %.2f/s (%d); shared schedule after: %.2f/s (%d); overall %.2f/s over %v",
		g1, n1, out, n2, g2, n3, overall, ts[len(ts)-1].Sub(ts[0]).Round(time.Millisecond))
	t.Logf("max in a closed 1 s window on the shared schedule: %d departures, %d at the downstream; anywhere: %d departures, %d at the downstream",
		depGlobal, arrGlobal, depAll, arrAll)
	t.Logf("fallback gauges during the outage %v, 2 s after the restart %v", during, after)
	for i, r := range reps {
		t.Logf("replica %d: %v departures, %v shared slots dropped, schedule delayed %.4f s", i,
			testutil.ToFloat64(r.m.Departures), testutil.ToFloat64(r.m.SlotsDropped), testutil.ToFloat64(r.m.ScheduleDelayed))
	}
	var bins []int // arrivals per 500 ms from the start
	for _, x := range ts {
		if k := int(x.Sub(start) / (500 * time.Millisecond)); !x.Before(start) {
			for len(bins) <= k {
				bins = append(bins, 0)
			}
			bins[k]++
		}
	}
	t.Logf("arrivals per 500 ms from the start (kill at 6 s, restart at 11 s): %v", bins)
	if depGlobal > limit+1 {
		t.Errorf("%d departures in a 1 s window on the shared schedule, bound %d", depGlobal, limit+1)
	}
	if arrGlobal > limit+2 {
		t.Errorf("%d calls at the downstream in a 1 s window on the shared schedule, bound %d + 1", arrGlobal, limit+1)
	}
	if bound := replicas * (limit/replicas + 1); depAll > bound || arrAll > bound+1 {
		t.Errorf("%d departures (%d at the downstream) in a 1 s window, bound %d (+1) with three local fallbacks", depAll, arrAll, bound)
	}
	// A lane woken later than its slot's tolerance drops the slot rather
	// than send late (G1), and the schedule makes it up (docs/scaling.md,
	// "Late wake-ups"), so a slow process costs little throughput, never
	// bursts: the ceiling is 1 %. What the downstream lacks of the limit on
	// the shared schedule is accounted for, slot by slot, by what the
	// replicas report: the slots they dropped (of which the schedule makes
	// up part) and the time late writes moved the schedule, plus G1's
	// 0.5 %; a slot lost any other way fails it. Where few slots were
	// dropped (≤ 2 % of the phase's departures) the rate must also be
	// within 3 % of the limit (149.3–150.1/s measured alone without -race
	// on one machine; 144.8–146.3/s beside a two-thread CPU hog). How many
	// are dropped is the machine's: on one VM, idle, 5–8 % of its timer
	// wake-ups came more than the 333 µs tolerance late (nanosleep: p50
	// 190 µs, p99 1.6–1.9 ms), and a phase dropped up to 100 slots. Under
	// -race, a CPU cost the product never pays, the floor is logged;
	// scripts/test.sh runs this test again without -race, where it is
	// asserted.
	for _, ph := range []struct {
		name     string
		rate     float64
		n        int
		from, to time.Time
	}{{"before the outage", g1, n1, at(1.5), killed}, {"after the restart", g2, n3, back, end}} {
		r := ph.rate
		if r > 1.01*limit {
			t.Errorf("aggregate %.2f/s on the shared schedule %s, want at most 1%% above %d/s", r, ph.name, limit)
		}
		dropped, delayed := ledger.between(ph.from, ph.to)
		span := float64(ph.n-1) / r
		allowed := limit*span + 1
		short := allowed - float64(ph.n)
		accounted := dropped + limit*delayed + 0.005*allowed
		t.Logf("%s: %.0f departures short of the limit over %.2f s; accounted for: %v slots dropped, schedule moved %.1f ms by late writes, 0.5 %% (%.1f)",
			ph.name, short, span, dropped, delayed*1e3, 0.005*allowed)
		if short > accounted {
			t.Errorf("%s: the downstream got %.0f departures fewer than the limit allows; the replicas account for %.1f of them", ph.name, short, accounted)
		}
		if r < 0.97*limit && dropped <= 0.02*float64(ph.n) {
			if raceEnabled {
				t.Logf("aggregate %.2f/s on the shared schedule %s with %v slots dropped, more than 3%% under %d/s: logged under -race, asserted without it", r, ph.name, dropped, limit)
			} else {
				t.Errorf("aggregate %.2f/s on the shared schedule %s with %v slots dropped, want within 3%% of %d/s", r, ph.name, dropped, limit)
			}
		}
	}
	if out > limit*1.01 || out < 0.9*limit {
		t.Errorf("aggregate %.2f/s during the outage, want ≤ %d/s (three replicas at %d/s)", out, limit, limit/replicas)
	}
	for i, r := range reps {
		if during[i] != 1 || after[i] != 0 {
			t.Errorf("replica %d: fallback gauge %v during the outage, %v 2 s after the restart; want 1 then 0", i, during[i], after[i])
		}
		r.log.mu.Lock()
		if r.log.warned != 1 || r.log.restored != 1 {
			t.Errorf("replica %d logged %d fallbacks and %d returns, want 1 each", i, r.log.warned, r.log.restored)
		}
		r.log.mu.Unlock()
	}
}

// slotLedger samples, every 20 ms, the sum over the replicas of the shared
// slots they dropped and of the time late writes moved the schedule
// (shaper_global_slots_dropped_total, shaper_global_schedule_delayed_seconds_total).
type slotLedger struct {
	mu      sync.Mutex
	samples []ledgerSample
	done    chan struct{}
	exited  chan struct{}
}

type ledgerSample struct {
	at               time.Time
	dropped, delayed float64
}

func startSlotLedger(ms []*metrics.Lane) *slotLedger {
	l := &slotLedger{done: make(chan struct{}), exited: make(chan struct{})}
	sample := func() {
		s := ledgerSample{at: time.Now()}
		for _, m := range ms {
			s.dropped += testutil.ToFloat64(m.SlotsDropped)
			s.delayed += testutil.ToFloat64(m.ScheduleDelayed)
		}
		l.mu.Lock()
		l.samples = append(l.samples, s)
		l.mu.Unlock()
	}
	sample()
	go func() {
		defer close(l.exited)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-l.done:
				sample()
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	return l
}

func (l *slotLedger) stop() {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	<-l.exited
}

// between returns what was reported from the last sample at or before
// from to the first sample at or after to: it counts the whole phase,
// and up to 20 ms more at each end.
func (l *slotLedger) between(from, to time.Time) (dropped, delayed float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lo, hi := l.samples[0], l.samples[len(l.samples)-1]
	for _, s := range l.samples {
		if !s.at.After(from) {
			lo = s
		}
	}
	for i := len(l.samples) - 1; i >= 0; i-- {
		if !l.samples[i].at.Before(to) {
			hi = l.samples[i]
		}
	}
	return hi.dropped - lo.dropped, hi.delayed - lo.delayed
}
