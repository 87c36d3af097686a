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

// TestOthers: G1's bound for windows of other lengths than a whole number
// of intervals, at 5,000/s and min_spacing 0.95 (windows of 1 ms or more):
// 7 instants need 1,140 µs (a window of 1.139 ms allows floor(5.69/0.95)
// + 1 = 6). Evenly spaced, the closest 7 have 60 µs to spare; one instant
// 190 µs late puts 7 in 1,010 µs.
func TestOthers(t *testing.T) {
	t0 := time.Unix(0, 0)
	even := make([]time.Time, 40)
	for i := range even {
		even[i] = t0.Add(time.Duration(i) * 200 * time.Microsecond)
	}
	if o := Others(even, 5000, 0.95, time.Millisecond, 21); !o.OK || o.Margin != 60*time.Microsecond || o.Broken != 0 || o.M != 6 {
		t.Errorf("even: %+v, want margin 60µs over 6 gaps, none broken", o)
	}
	late := append([]time.Time(nil), even...)
	late[10] = late[10].Add(190 * time.Microsecond) // at the end of its tile
	if o := Others(late, 5000, 0.95, time.Millisecond, 21); o.Margin != -130*time.Microsecond || o.Broken == 0 || o.M != 6 {
		t.Errorf("late: %+v, want margin −130µs over 6 gaps, broken", o)
	}
}
