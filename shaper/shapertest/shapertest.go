// Package shapertest holds the helpers that judge a lane's departures or
// arrivals against SPEC G1, once for every test of the module: the window
// counters, the gap, and the bounds. A window is half-open, [x, x+W), as in
// shared/cases/CASES.md; the closed variant is there for tests that judge
// [x, x+W] on purpose. Instants must be sorted. Standard library only.
package shapertest

import (
	"math"
	"time"
)

// MaxInWindow returns the largest number of the sorted instants ts in any
// half-open window [x, x+w), and the first instant of such a window.
func MaxInWindow(ts []time.Time, w time.Duration) (int, time.Time) {
	best, at, j := 0, time.Time{}, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= w {
			j++
		}
		if n := i - j + 1; n > best {
			best, at = n, ts[j]
		}
	}
	return best, at
}

// MaxInClosedWindow is MaxInWindow for closed windows [x, x+w].
func MaxInClosedWindow(ts []time.Time, w time.Duration) (int, time.Time) {
	best, at, j := 0, time.Time{}, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) > w {
			j++
		}
		if n := i - j + 1; n > best {
			best, at = n, ts[j]
		}
	}
	return best, at
}

// MinGap returns the smallest time between consecutive sorted instants, and
// the index of the later one; math.MaxInt64 and 0 for fewer than two.
func MinGap(ts []time.Time) (time.Duration, int) {
	g, at := time.Duration(math.MaxInt64), 0
	for i := 1; i < len(ts); i++ {
		if d := ts[i].Sub(ts[i-1]); d < g {
			g, at = d, i
		}
	}
	return g, at
}

// BoundWhole is SPEC G1's bound for a window of a whole number of intervals
// (1/limit): W × limit + 1 + slack. For other windows it is the floor of the
// same, the bound of a pacer that never leaves early.
func BoundWhole(w time.Duration, limit float64, slack int) int {
	return int(math.Floor(w.Seconds()*limit+1e-9)) + 1 + slack
}

// BoundAny is SPEC G1's bound for a window of any length W ≥ 1/limit:
// floor(W × limit / min_spacing) + 1 + slack (the make-up of lateness at
// min_spacing).
func BoundAny(w time.Duration, limit float64, slack int, minSpacing float64) int {
	return int(math.Floor(w.Seconds()*limit/minSpacing+1e-9)) + 1 + slack
}
