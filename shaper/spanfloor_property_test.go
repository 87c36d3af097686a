package shaper

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper/shapertest"
)

// spanCheck judges sorted stamps against SPEC G1 at limit for windows of
// 1 ms or more: one of any other length than a whole number of intervals
// (shapertest.Others, up to maxM gaps), and one of a whole number j of
// intervals at most j + 1 (m + 1 requests spanning no more than m − 1
// intervals break it). It returns the first break and how many kinds broke.
func spanCheck(stamps []time.Time, limit, s float64, maxM int) (string, int) {
	bad, first := 0, ""
	if o := shapertest.Others(stamps, limit, s, BatchWindow, maxM); o.Broken > 0 {
		bad++
		first = fmt.Sprintf("%d requests in %v (closest): bound floor(W × limit / %.2f) + 1 = %d", o.M+1, o.Span, s, o.M)
	}
	for m := 1; m <= maxM && m < len(stamps); m++ {
		j := float64(m - 1)
		if j/limit < 1e-3-1e-12 {
			continue
		}
		for i := 0; i+m < len(stamps); i++ {
			if d := stamps[i+m].Sub(stamps[i]); d.Seconds() <= j/limit {
				bad++
				if first == "" {
					first = fmt.Sprintf("%d requests in %v (at %d): %d intervals allow %d", m+1, d, i, m-1, m)
				}
				break
			}
		}
	}
	return first, bad
}

// spanRun drives a pacer as a lane whose sink gates its writes (the loop
// holds each departure to WireFloor and until the previous report):
// departures as late as the waiter makes them and 1 in 50 up to an interval
// later; delays to the report that are now and then almost nothing right
// after one that used the whole tile (a review helper's adversary); each
// request stamped anywhere from its departure to its report (plus the
// jitter budget of a report that is not exact). Every seg departures the
// limit becomes limitAt(i) (a reload when it changes). It returns the
// stamps of each seg departures, sorted.
func spanRun(rng *rand.Rand, s float64, exact bool, n, seg int, limitAt func(i int) Limit) [][]time.Time {
	lim := limitAt(0)
	p := NewPacer(PacerConfig{Limit: lim, MinSpacing: s}, t0)
	now, ready := t0, t0
	p.SetBusy(now, true)
	var out [][]time.Time
	var cur []time.Time
	for i := range n {
		if i > 0 && i%seg == 0 {
			out, cur = append(out, cur), nil
			if l := limitAt(i); l != lim {
				lim = l
				p.SetConfig(PacerConfig{Limit: lim, MinSpacing: s}, now)
			}
		}
		iv := p.interval(now)
		at := p.Next(now)
		if f := p.WireFloor(now); f.After(at) {
			at = f
		}
		dep := at
		if now.After(dep) {
			dep = now
		}
		if at.After(now) {
			dep = dep.Add(drawLateness(rng))
		}
		if rng.IntN(50) == 0 {
			dep = dep.Add(time.Duration(rng.Float64() * float64(iv)))
		}
		p.Depart(ready, dep)
		var d time.Duration
		switch x := rng.IntN(100); {
		case x < 20:
			d = time.Microsecond + time.Duration(rng.Int64N(int64(4*time.Microsecond)))
		case x < 45: // to the end of its tile (the schedule's time after Depart)
			d = p.tat.Sub(dep) - time.Duration(rng.Int64N(int64(3*time.Microsecond)))
		case x < 46:
			d = time.Duration(300+rng.IntN(3000)) * time.Microsecond
		default:
			d = 10*time.Microsecond + time.Duration(rng.Int64N(int64(120*time.Microsecond)))
		}
		w := dep.Add(max(d, 1))
		latest := w
		if !exact {
			latest = w.Add(iv - MakeUpLag(iv, 0, s))
		}
		var st time.Time
		switch rng.IntN(3) {
		case 0:
			st = dep.Add(1)
		case 1:
			st = latest
		default:
			st = dep.Add(time.Duration(rng.Float64() * float64(latest.Sub(dep))))
		}
		p.Wire(dep, w, exact)
		cur = append(cur, st)
		ready, now = dep, w
	}
	out = append(out, cur)
	for _, o := range out {
		sort.Slice(o, func(i, j int) bool { return o[i].Before(o[j]) })
	}
	return out
}

// TestPacerSpanFloorProperty: with the span floor held (WireFloor), every
// window of 1 ms or more at the downstream keeps SPEC G1's bound, whole or
// not, whatever the stamps between each departure and its report: from
// 1,001/s to 15,000/s, min_spacing 0.95, 0.8 and 1.0, reports exact or not
// (10 seeds each); and across reloads between 900/s and 10,000/s (30
// seeds, each run of one limit judged with the run before it at the higher
// of the two limits after an increase). Without the floor 7 of 10 seeds
// broke at 15,000/s (a review helper); without the marks below 1,000/s a
// reload from 900/s to 1,200/s put 3 requests in 1.557 ms (bound 2).
func TestPacerSpanFloorProperty(t *testing.T) {
	seeds := uint64(10)
	if testing.Short() {
		seeds = 2
	}
	for _, limit := range []Limit{1001, 1500, 3333, 5000, 10000, 15000} {
		for _, s := range []float64{0.95, 0.8, 1.0} {
			for _, exact := range []bool{true, false} {
				for seed := uint64(1); seed <= seeds; seed++ {
					rng := rand.New(rand.NewPCG(seed, 77))
					runs := spanRun(rng, s, exact, 6000, 6000, func(int) Limit { return limit })
					if msg, bad := spanCheck(runs[0], float64(limit), s, 60); bad > 0 {
						t.Errorf("%v, min_spacing %.2f, exact %v, seed %d: %s", limit, s, exact, seed, msg)
					}
				}
			}
		}
	}
	limits := []Limit{900, 1200, 1500, 3333, 5000, 5650, 7000, 10000}
	for seed := uint64(1); seed <= 3*seeds; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		seq := make([]Limit, 8)
		for i := range seq {
			seq[i] = limits[rng.IntN(len(limits))]
		}
		const seg = 500
		runs := spanRun(rng, DefaultMinSpacing, true, seg*len(seq), seg, func(i int) Limit { return seq[i/seg] })
		for k := range runs {
			judged := runs[k]
			if k > 0 && seq[k] > seq[k-1] { // an increase: the runs before and after at the new limit
				judged = append(append([]time.Time{}, runs[k-1]...), runs[k]...)
				sort.Slice(judged, func(i, j int) bool { return judged[i].Before(judged[j]) })
			}
			if seq[k] <= SpacingMaxRate {
				continue // windows of a whole interval and more: TestHTTPWireRate's
			}
			if msg, bad := spanCheck(judged, float64(seq[k]), DefaultMinSpacing, 60); bad > 0 {
				t.Errorf("seed %d, run %d (%v after %v): %s", seed, k, seq[k], seq[max(k-1, 0)], msg)
			}
		}
	}
}
