package shaper

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func aAt(d time.Duration) time.Time { return t0.Add(d) }

func TestAdaptiveRules(t *testing.T) {
	cfg := AdaptiveConfig{Min: 10, Max: 100, Cooldown: 5 * time.Second}
	tests := []struct {
		name string
		run  func(a *Adaptive) float64 // returns the rate to check
		want float64
	}{
		{"starts at max", func(a *Adaptive) float64 { return a.Rate(t0) }, 100},
		{"decrease by the factor", func(a *Adaptive) float64 {
			a.Saturated(aAt(0))
			return a.Rate(aAt(0))
		}, 90},
		{"second decrease within cooldown is ignored", func(a *Adaptive) float64 {
			a.Saturated(aAt(0))
			a.Saturated(aAt(4999 * time.Millisecond))
			return a.Rate(aAt(5 * time.Second))
		}, 90},
		{"decrease again after cooldown", func(a *Adaptive) float64 {
			a.Saturated(aAt(0))
			a.Success(aAt(0)) // accepted: 1 call in 5 s → halving bounds it
			a.rate = 90
			a.accepted = 1000 // as if plenty were accepted
			a.Saturated(aAt(5 * time.Second))
			return a.Rate(aAt(5 * time.Second))
		}, 81},
		{"decrease to the accepted rate", func(a *Adaptive) float64 {
			a.Saturated(aAt(0)) // 90
			a.accepted = 300    // 60/s over 5 s
			a.since = aAt(0)
			a.Saturated(aAt(5 * time.Second))
			return a.Rate(aAt(5 * time.Second))
		}, 60},
		{"no call accepted since: at most halves", func(a *Adaptive) float64 {
			a.Saturated(aAt(0))
			a.Saturated(aAt(5 * time.Second))
			return a.Rate(aAt(5 * time.Second))
		}, 45},
		{"never below min", func(a *Adaptive) float64 {
			for i := range 40 {
				a.Saturated(aAt(time.Duration(i) * 5 * time.Second))
			}
			return a.Rate(aAt(time.Hour))
		}, 10},
		{"additive increase: back to top in two cooldowns", func(a *Adaptive) float64 {
			a.accepted, a.since = 1000, aAt(0)
			a.Saturated(aAt(time.Second)) // 100 → 90, top 100: step 1/s per s
			for tt := time.Second; tt < 11*time.Second; tt += time.Duration(float64(time.Second) / a.Rate(aAt(tt))) {
				a.Success(aAt(tt))
			}
			return math.Round(a.Rate(aAt(11 * time.Second)))
		}, 100},
		{"increase per call, not per second", func(a *Adaptive) float64 {
			a.accepted, a.since = 1000, aAt(0)
			a.Saturated(aAt(time.Second)) // 90, step 1/s per s
			for range 90 {                // one second of calls at 90/s, all at one instant
				a.Success(aAt(time.Hour))
			}
			return math.Round(a.Rate(aAt(time.Hour))*10) / 10
		}, 91},
		{"never above max", func(a *Adaptive) float64 {
			for i := range 1000 {
				a.Success(aAt(time.Duration(i) * time.Millisecond))
			}
			return a.Rate(aAt(time.Second))
		}, 100},
		{"remaining/reset caps the rate until the reset", func(a *Adaptive) float64 {
			a.Headers(aAt(0), RateLimitInfo{Limit: -1, Remaining: 40, Reset: 2 * time.Second})
			return a.Rate(aAt(time.Second))
		}, 20},
		{"the cap ends at the reset", func(a *Adaptive) float64 {
			a.Headers(aAt(0), RateLimitInfo{Limit: -1, Remaining: 40, Reset: 2 * time.Second})
			return a.Rate(aAt(2 * time.Second))
		}, 100},
		{"the cap is clamped to min", func(a *Adaptive) float64 {
			a.Headers(aAt(0), RateLimitInfo{Limit: -1, Remaining: 1, Reset: 10 * time.Second})
			return a.Rate(aAt(time.Second))
		}, 10},
		{"limit per window caps the rate", func(a *Adaptive) float64 {
			a.Headers(aAt(0), RateLimitInfo{Limit: 3000, Remaining: -1, Window: time.Minute})
			return a.Rate(aAt(time.Second))
		}, 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAdaptive(cfg)
			if got := tc.run(a); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("rate = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAdaptivePauseOnSpentBudget(t *testing.T) {
	a := NewAdaptive(AdaptiveConfig{Min: 10, Max: 100})
	if got := a.Headers(aAt(0), RateLimitInfo{Limit: 100, Remaining: 5, Reset: 3 * time.Second}); !got.IsZero() {
		t.Fatalf("remaining 5: pause until %v, want none", got)
	}
	got := a.Headers(aAt(time.Second), RateLimitInfo{Limit: 100, Remaining: 0, Reset: 3 * time.Second})
	if want := aAt(4 * time.Second); !got.Equal(want) || !a.PauseUntil().Equal(want) {
		t.Fatalf("remaining 0, reset 3s: pause until %v (PauseUntil %v), want %v", got, a.PauseUntil(), want)
	}
	if got := a.Headers(aAt(time.Second), RateLimitInfo{Limit: 100, Remaining: 0}); !got.IsZero() {
		t.Fatalf("remaining 0 without a reset: pause until %v, want none", got)
	}
}

// TestAdaptiveConvergesOnWall runs the rule against a downstream that
// accepts up to wall per second (a token bucket of burst 2) and answers 429
// above, with departures exactly at the rate in force and every answer fed
// back at once: from 20 s on, the accepted rate stays within 52/60 and 1.0
// of the wall (the SPEC §3 proof, 52–60/s at 60/s) and fewer than 2 % of the
// calls get a 429. Seeds are printed.
func TestAdaptiveConvergesOnWall(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for range 20 {
		limit := 20 + rng.Float64()*1980
		wall := limit * (0.2 + 0.7*rng.Float64())
		if rng.IntN(4) == 0 {
			limit, wall = 100, 60
		}
		a := NewAdaptive(AdaptiveConfig{Min: Limit(limit / 10), Max: Limit(limit), Cooldown: 5 * time.Second})
		tokens, lastFill := 2.0, t0
		var calls, rejected, acceptedWin int
		var ts time.Duration
		const from, to = 20 * time.Second, 60 * time.Second
		secAccepted := map[int]int{}
		for ts < to {
			now := aAt(ts)
			tokens = math.Min(2, tokens+now.Sub(lastFill).Seconds()*wall)
			lastFill = now
			ok := tokens >= 1
			if ok {
				tokens--
				a.Success(now)
			} else {
				a.Saturated(now)
			}
			if ts >= from {
				calls++
				if !ok {
					rejected++
				} else {
					acceptedWin++
					secAccepted[int(ts/time.Second)]++
				}
			}
			ts += time.Duration(float64(time.Second) / a.Rate(now))
		}
		got := float64(acceptedWin) / (to - from).Seconds()
		if got < wall*52/60 || got > wall {
			t.Errorf("limit %.1f wall %.1f: accepted %.2f/s from 20 s on, want in [%.2f, %.2f]", limit, wall, got, wall*52/60, wall)
		}
		if share := float64(rejected) / float64(calls); share >= 0.02 {
			t.Errorf("limit %.1f wall %.1f: %.2f %% of calls got a 429, want < 2 %%", limit, wall, 100*share)
		}
	}
}
