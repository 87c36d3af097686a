package shaper

import (
	"testing"
	"time"
)

// TestPacerRebase: a pacer whose departures were timed by something else
// (here: every third slot of a shared schedule at 90/s) looks late at each
// of them; taking over at 30/s after Rebase, it departs at exactly 1/30 s
// from the previous departure, without catching the apparent lateness up.
func TestPacerRebase(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := NewPacer(PacerConfig{Limit: 90}, t0)
	iv90 := time.Second / 90
	now := t0
	for range 10 {
		if at := p.Next(now); at.After(now) {
			t.Fatalf("the local pacer at 90/s holds a departure every 3 intervals")
		}
		p.Depart(now, now)
		now = now.Add(3 * iv90)
	}
	last := now.Add(-3 * iv90)
	p.SetConfig(PacerConfig{Limit: 30}, now)
	p.Rebase(now)
	iv30 := time.Second / 30
	prev := last
	for i := range 100 {
		at := p.Next(prev)
		if want := prev.Add(iv30); at.Sub(want).Abs() > time.Microsecond {
			t.Fatalf("departure %d at %v after the previous, want %v", i, at.Sub(prev), iv30)
		}
		p.Depart(prev, at)
		prev = at
	}
	var fresh Pacer
	fresh.Rebase(t0) // no departure yet: nothing to do
	if !fresh.tat.IsZero() {
		t.Error("Rebase without a departure changed the schedule")
	}
}
