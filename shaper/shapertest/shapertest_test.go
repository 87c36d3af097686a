package shapertest

import (
	"testing"
	"time"
)

func TestWindows(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	ts := at(0, 10, 20, 30, 1000, 1001)
	if n, x := MaxInWindow(ts, 30*time.Millisecond); n != 3 || !x.Equal(t0) {
		t.Errorf("half-open 30 ms: %d at %v, want 3 at 0", n, x)
	}
	if n, _ := MaxInClosedWindow(ts, 30*time.Millisecond); n != 4 {
		t.Errorf("closed 30 ms: %d, want 4", n)
	}
	if g, i := MinGap(ts); g != time.Millisecond || i != 5 {
		t.Errorf("min gap %v at %d, want 1ms at 5", g, i)
	}
	if b := BoundWhole(time.Second, 100, 0); b != 101 {
		t.Errorf("whole bound %d", b)
	}
	if b := BoundAny(15*time.Millisecond, 100, 0, 0.95); b != 2 {
		t.Errorf("any bound %d, want floor(1.5/0.95)+1 = 2", b)
	}
}
