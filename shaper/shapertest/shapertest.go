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

// Other is the closest that sorted instants came to SPEC G1's bound for
// windows whose length is not a whole number of intervals (Others): M + 1
// of them spanned Span, where a window of W ≥ minW allows M + 1 only when
// Span ≥ Need = M × minSpacing / limit; Margin = Span − Need, negative
// when a window broke the bound. Broken counts the (m, first instant)
// pairs that broke it; OK is false when no m was judged.
type Other struct {
	M                  int
	Span, Need, Margin time.Duration
	Broken             int
	OK                 bool
}

// Others judges the sorted instants ts against SPEC G1's bound for a
// window of any length W ≥ minW (1/limit, or 1 ms above 1,000/s):
// floor(W × limit / minSpacing) + 1 (slack 0). A window holding m + 1
// instants is at least as long as their span D and at least minW, so it
// breaks the bound exactly when m > floor(max(D, minW) × limit /
// minSpacing): never for m ≤ minW × limit / minSpacing, and beyond it
// when D < m × minSpacing / limit. It looks at m from there up to maxM.
func Others(ts []time.Time, limit, minSpacing float64, minW time.Duration, maxM int) Other {
	var o Other
	first := int(math.Floor(minW.Seconds()*limit/minSpacing+1e-9)) + 1
	for m := first; m <= maxM && m < len(ts); m++ {
		need := time.Duration(math.Round(float64(m) * minSpacing * float64(time.Second) / limit))
		for i := 0; i+m < len(ts); i++ {
			span := ts[i+m].Sub(ts[i])
			if int(math.Floor(max(span, minW).Seconds()*limit/minSpacing+1e-9)) < m {
				o.Broken++
			}
			if margin := span - need; !o.OK || margin < o.Margin {
				o.M, o.Span, o.Need, o.Margin, o.OK = m, span, need, margin, true
			}
		}
	}
	return o
}
