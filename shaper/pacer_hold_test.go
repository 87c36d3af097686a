package shaper

import (
	"math"
	"testing"
	"time"
)

// TestPacerHoldCools: a held lane cools like an idle one while its bucket
// is full (SPEC §3 Warmup and Breaker), reports rate 0, and warms again
// from where it cooled once the hold ends.
func TestPacerHoldCools(t *testing.T) {
	p := NewPacer(PacerConfig{Limit: 100, WarmupPeriod: 4 * time.Second, ColdFactor: 4}, t0)
	p.SetBusy(t0, true) // a backlog all along
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	if w := p.Warmth(at(4)); w != 1 {
		t.Fatalf("warmth after 4 s of work %v, want 1", w)
	}
	p.Hold(at(4), true)
	if r := p.Rate(at(5)); r != 0 {
		t.Errorf("rate while held %v, want 0", r)
	}
	if w := p.Warmth(at(6)); math.Abs(w-0.5) > 1e-9 {
		t.Fatalf("warmth after 2 s held with a full bucket %v, want 0.5 (cools as if idle)", w)
	}
	if r := p.RampRate(at(6)); math.Abs(r-62.5) > 1e-9 {
		t.Errorf("ramp rate at w=0.5 %v, want 62.5", r)
	}
	p.Hold(at(6), false)
	if w := p.Warmth(at(7)); math.Abs(w-0.75) > 1e-9 {
		t.Errorf("warmth 1 s after the hold ended %v, want 0.75 (warms again)", w)
	}
	if r := p.Rate(at(7)); math.Abs(r-81.25) > 1e-9 {
		t.Errorf("rate after the hold %v, want 81.25", r)
	}
}

// TestPacerHoldThenRamp: a warm lane under a backlog held for a whole
// period resumes fully cold: from the end of the hold its departures stay
// under the ramp's integral plus one (no burst, SPEC G2), and the first
// gaps are the cold interval.
func TestPacerHoldThenRamp(t *testing.T) {
	p := NewPacer(PacerConfig{Limit: 100, WarmupPeriod: 4 * time.Second, ColdFactor: 4}, t0)
	s := &sim{p: p, now: t0}
	s.run(600) // warm by now (past 4 s)
	end := s.now
	if w := p.Warmth(end); w != 1 {
		t.Fatalf("warmth %v after the run, want 1", w)
	}
	p.Hold(end, true)
	release := end.Add(10 * time.Second)
	p.Hold(release, false)
	s2 := &sim{p: p, now: release}
	deps := s2.run(400)
	for i, d := range deps {
		if float64(i+1) > rampIntegral(100, 4, 4, d.Sub(release).Seconds())+1+1e-9 {
			t.Fatalf("departure %d at %v after the hold exceeds the cold ramp's integral + 1 (%.1f)",
				i+1, d.Sub(release), rampIntegral(100, 4, 4, d.Sub(release).Seconds())+1)
		}
	}
	if g := deps[1].Sub(deps[0]); g < 39*time.Millisecond {
		t.Errorf("first gap after the hold %v, want the cold interval (40 ms)", g)
	}
}

// TestPacerHoldIsNotLateness: the time a lane with a backlog is held (an
// operator's pause, an open breaker) is not lateness given up
// (TakeForgiven; shaper_departure_lateness_forgiven_seconds_total): not at
// the first departure after the hold, nor at a departure while held (a
// breaker's probe). A departure late after the hold ended still counts.
func TestPacerHoldIsNotLateness(t *testing.T) {
	p := NewPacer(PacerConfig{Limit: 100}, t0)
	s := &sim{p: p, now: t0}
	s.run(10)
	end := s.now
	p.TakeForgiven()
	p.Hold(end, true)
	release := end.Add(5 * time.Second)
	p.Hold(release, false)
	p.Depart(end, release) // ready since before the hold
	if late, _ := p.TakeForgiven(); late != 0 {
		t.Errorf("first departure after a 5 s hold: forgiven %v, want 0", late)
	}
	// 50 ms late after the hold: 50 ms less the 9 ms MakeUpLag at 100/s.
	next := p.Next(release)
	p.Depart(release, next.Add(50*time.Millisecond))
	if late, _ := p.TakeForgiven(); late != 41*time.Millisecond {
		t.Errorf("a departure 50 ms late after the hold: forgiven %v, want 41ms", late)
	}
	held := next.Add(time.Second)
	p.Hold(held, true)
	p.Depart(next, held.Add(3*time.Second)) // a probe while held
	if late, _ := p.TakeForgiven(); late != 0 {
		t.Errorf("a departure while held: forgiven %v, want 0", late)
	}
}
