package main

import (
	"context"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/shaper-dev/shaper/internal/testserver"
	"github.com/shaper-dev/shaper/metrics"
)

// TestRedisBound: the window bounds of section 6 are floor(W × rate) + 1,
// plus docs/scaling.md's clock-conversion allowance at 10,000/s only, and
// windows under one interval (or 1 ms at 1,000/s and below) are not judged.
func TestRedisBound(t *testing.T) {
	for _, c := range []struct {
		w      time.Duration
		rate   float64
		want   int
		judged bool
	}{
		{time.Second, 100, 101, true},
		{10 * time.Millisecond, 100, 2, true},
		{time.Millisecond, 100, 0, false},
		{time.Millisecond, 1000, 0, false},
		{10 * time.Millisecond, 1000, 11, true},
		{time.Second, 10000, 10002, true},
		{10 * time.Millisecond, 10000, 102, true},
		{time.Millisecond, 10000, 12, true},
	} {
		got, judged := redisBound(c.w, c.rate)
		if got != c.want || judged != c.judged {
			t.Errorf("redisBound(%s, %v) = %d, %v; want %d, %v", c.w, c.rate, got, judged, c.want, c.judged)
		}
	}
}

// TestJudgeLane: a lane at 5/s may hold 6 departures in a closed 1 s window
// and 2 in one interval (200 ms); one more in either is over.
func TestJudgeLane(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		out := make([]time.Time, len(ms))
		for i, m := range ms {
			out[i] = t0.Add(time.Duration(m) * time.Millisecond)
		}
		return out
	}
	for _, c := range []struct {
		name     string
		deps     []time.Time
		w1, wiv  int
		overWant bool
	}{
		{"exact", at(0, 200, 400, 600, 800, 1000, 1200), 6, 2, false},
		{"unsorted exact", at(400, 0, 200), 3, 2, false},
		{"7 in 1 s", at(0, 150, 300, 450, 600, 750, 900), 7, 2, true},
		{"3 in 200 ms", at(0, 100, 200, 600), 4, 3, true},
	} {
		w1, wiv, over := judgeLane(c.deps, 5)
		if w1 != c.w1 || wiv != c.wiv || over != c.overWant {
			t.Errorf("%s: judgeLane = %d, %d, %v; want %d, %d, %v", c.name, w1, wiv, over, c.w1, c.wiv, c.overWant)
		}
	}
}

// TestRedisStats: section 6 counts the script calls the server served, from
// a real redis-server's INFO commandstats: EVALSHA and the EVAL of a script
// not loaded yet.
func TestRedisStats(t *testing.T) {
	rd := testserver.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: rd.Addr, DisableIdentity: true})
	defer c.Close()
	ctx := context.Background()
	before, err := redisStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	s := redis.NewScript("return redis.call('TIME')")
	for range 3 {
		// Run tries EVALSHA, then EVAL on NOSCRIPT (the first time).
		if err := s.Run(ctx, c, []string{"k"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	after, err := redisStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	// 3 EVALSHA (the first answered NOSCRIPT) + 1 EVAL.
	if got := after.calls - before.calls; got != 4 {
		t.Errorf("script calls counted: %d, want 4 (3 EVALSHA + 1 EVAL)", got)
	}
	if after.cpu <= 0 {
		t.Errorf("redis CPU %v, want > 0", after.cpu)
	}
}

// TestReadProc: section 9 reads a process's CPU time and context switches
// from /proc, summed over its threads; here, this test's own process, whose
// CPU time getrusage also gives. Two goroutines spin until the process used
// 100 ms more (by CPU time, not wall time: the cores are shared).
func TestReadProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("needs Linux /proc")
	}
	before, ru0 := mustReadProc(t), cpuTime()
	done := make(chan struct{})
	for range 2 {
		go func() {
			for cpuTime()-ru0 < 100*time.Millisecond {
			}
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	after, ru := mustReadProc(t), cpuTime()-ru0
	d := after.run - before.run
	if diff := (d - ru).Abs(); diff > 10*time.Millisecond+ru/10 {
		t.Errorf("/proc says the process used %v, getrusage %v", d, ru)
	}
	if ticks := after.ticks - before.ticks; (ticks - ru).Abs() > 30*time.Millisecond {
		t.Errorf("/proc/PID/stat says %v, getrusage %v", ticks, ru)
	}
	if after.switches <= before.switches || after.threads < 2 {
		t.Errorf("context switches %d → %d, threads %d", before.switches, after.switches, after.threads)
	}
}

func mustReadProc(t *testing.T) procSample {
	t.Helper()
	s, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestIdleVerdict: section 9's headline says over when the daemon used the
// bound or more, and a full run counts it as a failed measurement.
func TestIdleVerdict(t *testing.T) {
	for _, c := range []struct {
		cpu   time.Duration
		word  string
		quick bool
		fails bool
	}{
		{200 * time.Millisecond, "under", false, false},
		{300 * time.Millisecond, "over", false, true},
		{300 * time.Millisecond, "over", true, false}, // quick: a smoke number
	} {
		row := idleRow{lanes: 10, span: time.Minute, scrapeEvery: 15 * time.Second, cpu: c.cpu}
		r := &Results{opts: Options{Quick: c.quick}}
		r.idle = &row
		hs := r.idleHeadline()
		if len(hs) != 1 || !strings.Contains(hs[0], " "+c.word+" the 0.5 % bound") {
			t.Errorf("%v in 60 s: headline %q, want %q", c.cpu, hs, c.word)
		}
		r.noteIdle(row)
		if fails := len(r.problems) > 0; fails != c.fails {
			t.Errorf("%v in 60 s (quick %v): problems %q", c.cpu, c.quick, r.problems)
		}
	}
}

// TestWithServers: a starter's Fatal is withServers's error, and the
// cleanups run, last first.
func TestWithServers(t *testing.T) {
	var order []int
	err := withServers(func(tb testing.TB) error {
		tb.Cleanup(func() { order = append(order, 1) })
		tb.Cleanup(func() { order = append(order, 2) })
		tb.Fatalf("no %s", "server")
		return nil
	})
	if err == nil || err.Error() != "no server" {
		t.Errorf("err = %v, want \"no server\"", err)
	}
	if len(order) != 2 || order[0] != 2 || order[1] != 1 {
		t.Errorf("cleanups ran %v, want [2 1]", order)
	}
}

// TestFewestInWindow: G1's long-run check of section 10 counts the fewest
// departures of a lane in a half-open 10 s window; at 5/s that is 50, and a
// lane may be 1 short (0.5 % of 50, at least 1).
func TestFewestInWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	every := func(n int, skip ...int) []time.Time {
		var out []time.Time
		for i := range n {
			if !slices.Contains(skip, i) {
				out = append(out, t0.Add(time.Duration(i)*200*time.Millisecond))
			}
		}
		return out
	}
	want, tol := longRunWant(5)
	if want != 50 || tol != 1 {
		t.Fatalf("longRunWant(5) = %d ± %d, want 50 ± 1", want, tol)
	}
	for _, c := range []struct {
		name string
		deps []time.Time
		want int
	}{
		{"exact 20 s", every(101), 50},
		{"one missing", every(101, 40), 49},
		{"two missing", every(101, 40, 41), 48},
		{"shorter than 10 s", every(40), -1},
	} {
		if got := fewestInWindow(c.deps, longRunWindow); got != c.want {
			t.Errorf("%s: fewest %d, want %d", c.name, got, c.want)
		}
	}
}

// TestMergedLateness: section 10 merges the lateness histograms of all lanes
// and counts the departures later than the make-up (5 % of an interval: 10 ms
// at 5/s).
func TestMergedLateness(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	a, b := m.Lane("a", 5), m.Lane("b", 5)
	for range 60 {
		a.Lateness.Observe(0.001)
	}
	for range 38 {
		b.Lateness.Observe(0.001)
	}
	b.Lateness.Observe(0.05)
	b.Lateness.Observe(0.05)
	p99, share := mergedLateness(reg, 0.01)
	if math.Abs(share-0.02) > 1e-9 || p99 != 60*time.Millisecond {
		t.Errorf("mergedLateness = %v, %v; want 60ms (the bucket holding 0.05 s), 0.02", p99, share)
	}
}

// TestJoinClosest (bench/httpsink.go, section 11): the closest window of 52
// requests at the stamps is found and joined, by order, with the same
// requests' departures and wire reports.
func TestJoinClosest(t *testing.T) {
	const n = 200
	iv := time.Second / httpRate
	t0 := time.Unix(1000, 0)
	at := make([]time.Time, n)
	pairs := make([][2]time.Time, n)
	for j := range n {
		dep := t0.Add(time.Duration(j) * iv)
		at[j] = dep.Add(30 * time.Microsecond)
		pairs[j] = [2]time.Time{dep, at[j].Add(10 * time.Microsecond)}
	}
	// Request 60 reached the wire 100 µs late (its stamp and report), so
	// 60 … 111 is the closest window at the stamps: 51 intervals − 100 µs.
	// Its report came 3 µs after its stamp; the window's last one's 10 µs.
	at[60] = at[60].Add(100 * time.Microsecond)
	pairs[60][1] = at[60].Add(3 * time.Microsecond)
	pairs[5][1] = pairs[5][0].Add(20 * time.Microsecond) // the quickest before the window
	pairs[150][1] = pairs[150][0].Add(15 * time.Microsecond)
	c := joinClosest(at, pairs, 10*time.Millisecond)
	if c == nil {
		t.Fatal("no join")
	}
	want := closestWindow{first: 60, stamps: 51*iv - 100*time.Microsecond, departs: 51 * iv,
		reports: 51*iv - 93*time.Microsecond, firstAfter: 3 * time.Microsecond, lastAfter: 10 * time.Microsecond,
		fast: 15 * time.Microsecond, fastThen: 20 * time.Microsecond}
	if *c != want {
		t.Fatalf("joinClosest = %+v\nwant           %+v", *c, want)
	}
	// A departure recorded after its own stamp means the join is off.
	off := slices.Clone(pairs)
	off[190][0] = at[190].Add(time.Microsecond)
	if c := joinClosest(at, off, 10*time.Millisecond); c == nil || c.misordered != 1 {
		t.Fatalf("joinClosest with one departure after its stamp = %+v, want 1 misordered", c)
	}
	if joinClosest(at, pairs[1:], 10*time.Millisecond) != nil {
		t.Fatal("a join of different counts")
	}
}

// TestCPUPairsMedian: section 4's judged ratio is the median of the pairs'
// ratios, not the ratio of the medians, and a pair whose x/time/rate run
// measured nothing is left out.
func TestCPUPairsMedian(t *testing.T) {
	us := time.Microsecond
	p := cpuPairs{rate: 1000,
		lane:  []time.Duration{189 * us, 150 * us, 100 * us, 120 * us},
		xrate: []time.Duration{127 * us, 160 * us, 110 * us, 0}}
	if got := len(p.ratios()); got != 3 {
		t.Fatalf("%d ratios, want 3 (the pair with x/time/rate at 0 left out)", got)
	}
	if got, want := p.median(), 150.0/160; math.Abs(got-want) > 1e-9 {
		t.Errorf("median %.4f, want %.4f (ratios 1.49, 0.94, 0.91; the ratio of the medians would be 1.18)", got, want)
	}
	if got := medianOf([]time.Duration{4, 1, 3, 2}); got != 2 {
		t.Errorf("median of 1..4 = %v, want 2 (the mean of the middle two, in ns)", got)
	}
	if got := (cpuPairs{}).median(); got != 0 {
		t.Errorf("no pairs: %v, want 0", got)
	}
}

// TestThrPaired: section 3's lines are judged on shares taken repetition
// by repetition (the ceiling and the lane of the same repetition), not on
// the ratio of the medians; a repetition with an error is left out.
func TestThrPaired(t *testing.T) {
	us := time.Microsecond
	rep := func(rate float64, cpu time.Duration) endToEnd { return endToEnd{perSecond: rate, cpuPerMsg: cpu} }
	rows := []thrRow{
		{name: "ceiling", reps: []endToEnd{rep(200, 7*us), rep(200, 8*us), rep(100, 9*us), rep(200, 7*us)}},
		{name: "fetch"},
		{name: "lane", reps: []endToEnd{rep(180, 8*us), rep(190, 10*us), rep(100, 9*us), {perSecond: 150, cpuPerMsg: 9 * us, err: errors.New("boom")}}},
	}
	rate, cpu := thrPaired(rows)
	if len(rate) != 3 || len(cpu) != 3 {
		t.Fatalf("%d and %d shares, want 3 each (the failed repetition left out)", len(rate), len(cpu))
	}
	for i, want := range []float64{90, 95, 100} {
		if math.Abs(rate[i]-want) > 1e-9 {
			t.Errorf("repetition %d: rate share %.2f %%, want %.2f %%", i+1, rate[i], want)
		}
	}
	for i, want := range []float64{87.5, 80, 100} {
		if math.Abs(cpu[i]-want) > 1e-9 {
			t.Errorf("repetition %d: CPU share %.2f %%, want %.2f %% (the ceiling's CPU over the lane's)", i+1, cpu[i], want)
		}
	}
	if got := rows[0].medianCPU(); got != 7500*time.Nanosecond {
		t.Errorf("median CPU of the ceiling %v, want 7.5µs (its own median, not the rate-median repetition's)", got)
	}
}
