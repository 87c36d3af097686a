package shaper

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper/shapertest"
)

func TestQuotaRules(t *testing.T) {
	s := func(x float64) time.Time { return t0.Add(time.Duration(math.Round(x * float64(time.Second)))) }
	q := NewQuota(3, 10*time.Second, t0)
	steps := []struct {
		depart    float64 // departure at this instant (s), < 0 = none
		now       float64
		next      float64
		remaining int
	}{
		{-1, 0, 0, 3},
		{0, 0, 0, 2},
		{1, 1, 1, 1},
		{2, 2, 10.002, 0}, // spent: 10 s + QuotaMargin after the oldest (0 s)
		{-1, 9.999, 10.002, 0},
		{-1, 10.001, 10.002, 1}, // Remaining counts (0.001, 10.001]: the 0 s is out
		{10.002, 10.002, 11.002, 0},
		{-1, 12, 12, 2}, // (2, 12] holds only the departure at 10 s
	}
	for i, st := range steps {
		if st.depart >= 0 {
			if got := q.Next(s(st.depart)); !got.Equal(s(st.depart)) {
				t.Fatalf("step %d: departure at %vs not allowed (next %v)", i, st.depart, got.Sub(t0))
			}
			q.Depart(s(st.depart))
		}
		if got := q.Next(s(st.now)); !got.Equal(s(st.next)) {
			t.Errorf("step %d: Next(%vs) = %v, want %vs", i, st.now, got.Sub(t0), st.next)
		}
		if got := q.Remaining(s(st.now)); got != st.remaining {
			t.Errorf("step %d: Remaining(%vs) = %d, want %d", i, st.now, got, st.remaining)
		}
	}
	off := NewQuota(0, time.Hour, t0)
	off.Depart(t0)
	if !off.Next(t0).Equal(t0) || off.Remaining(t0) != -1 {
		t.Errorf("count 0: Next %v Remaining %d, want no quota", off.Next(t0).Sub(t0), off.Remaining(t0))
	}
}

func TestQuotaReloadKeepsNewest(t *testing.T) {
	q := NewQuota(5, 10*time.Second, t0)
	for i := range 5 {
		q.Depart(t0.Add(time.Duration(i) * time.Second))
	}
	q.SetConfig(2, 10*time.Second) // the newest two (3 s, 4 s) count
	if got := q.Next(t0.Add(5 * time.Second)); !got.Equal(t0.Add(13*time.Second + QuotaMargin)) {
		t.Errorf("after shrinking to 2: Next = %v, want 13.002s", got.Sub(t0))
	}
	q.SetConfig(4, 10*time.Second)
	if got := q.Remaining(t0.Add(5 * time.Second)); got != 2 {
		t.Errorf("after growing to 4: Remaining = %d, want 2", got)
	}
}

// TestQuotaProperty drives a pacer and a quota together the way the
// departure loop does, under a backlog, with random count, window and rate
// (seed printed): no window of length per holds more than count, each
// window after the first holds count when the rate could fill it, and the
// first departure after each quota wait is followed by one a whole interval
// later (no catch-up: the wait earns nothing, SPEC G2), with every window of
// a whole number of intervals within G1's bound.
func TestQuotaProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	for range 30 {
		limit := 5 + rng.Float64()*500
		per := time.Duration(1+rng.IntN(20)) * time.Second
		count := 1 + rng.IntN(int(limit*per.Seconds()*0.9))
		p := NewPacer(PacerConfig{Limit: Limit(limit)}, t0)
		p.SetBusy(t0, true)
		q := NewQuota(count, per, t0)
		now, ready := t0, t0
		var ts []time.Time
		var afterWait []int
		for now.Sub(t0) < 6*per {
			at := p.Next(now)
			waited := false
			if qa := q.Next(now); qa.After(at) {
				at, waited = qa, true
			}
			now = at.Add(time.Duration(rng.IntN(50)) * time.Microsecond) // a late waiter
			if waited {
				ready = at // the drain loop's rule: the quota's end is when the work was ready
				afterWait = append(afterWait, len(ts))
			}
			p.Depart(ready, now)
			q.Depart(now)
			ts = append(ts, now)
			ready = now
		}
		if n, from := shapertest.MaxInWindow(ts, per); n > count {
			t.Fatalf("limit %.1f count %d per %v: %d departures in the window from %v", limit, count, per, n, from.Sub(t0))
		}
		for w := 1; w < 5; w++ {
			start, end := t0.Add(time.Duration(w)*per), t0.Add(time.Duration(w+1)*per)
			n := 0
			for _, x := range ts {
				if !x.Before(start) && x.Before(end) {
					n++
				}
			}
			if n < count-1 {
				t.Errorf("limit %.1f count %d per %v: window %d holds %d, want the quota used in full", limit, count, per, w, n)
			}
		}
		iv := Limit(limit).Interval()
		for _, i := range afterWait {
			if i+1 < len(ts) {
				if g := ts[i+1].Sub(ts[i]); g < time.Duration(0.95*float64(iv)) {
					t.Fatalf("limit %.1f count %d: gap %v after a quota wait, under 0.95 interval %v", limit, count, g, iv)
				}
			}
		}
		if n, _ := shapertest.MaxInWindow(ts, time.Second); n > shapertest.BoundAny(time.Second, limit, 0, DefaultMinSpacing) {
			t.Fatalf("limit %.3f: %d in a 1 s window, above G1's bound %d", limit, n, shapertest.BoundAny(time.Second, limit, 0, DefaultMinSpacing))
		}
		w := time.Duration(math.Ceil(10 * float64(time.Second) / limit)) // a whole number of intervals
		if n, _ := shapertest.MaxInWindow(ts, w); n > shapertest.BoundWhole(w, limit, 0) {
			t.Fatalf("limit %.3f: %d in a window of 10 intervals, above G1's bound %d", limit, n, shapertest.BoundWhole(w, limit, 0))
		}
	}
}

func TestQuotaCountsFromTheWire(t *testing.T) {
	q := NewQuota(2, 10*time.Second, t0)
	q.Depart(t0)
	q.Depart(t0.Add(time.Second))
	q.Wired(t0, t0.Add(5*time.Millisecond)) // the first request paid a dial
	if got, want := q.Next(t0.Add(2*time.Second)), t0.Add(10*time.Second+5*time.Millisecond+QuotaMargin); !got.Equal(want) {
		t.Errorf("Next = %v, want %v (10 s + margin after the first reached the wire)", got.Sub(t0), want.Sub(t0))
	}
	q.Wired(t0.Add(7*time.Second), t0.Add(8*time.Second)) // unknown departure: nothing changes
	if got, want := q.Next(t0.Add(2*time.Second)), t0.Add(10*time.Second+5*time.Millisecond+QuotaMargin); !got.Equal(want) {
		t.Errorf("after an unknown Wired: Next = %v, want %v", got.Sub(t0), want.Sub(t0))
	}
}
