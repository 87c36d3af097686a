package tick

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestUntil: the wait lies in (0, every] and ends on the grid, and the
// grids of periods that divide one another nest: every instant of the 2 s
// grid is one of the 1 s and 250 ms grids, so a house tick every 2 s meets
// a pull renewal every second.
func TestUntil(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	on := func(at time.Time, every time.Duration) bool {
		return (at.UnixNano()+int64(Phase))%int64(every) == 0
	}
	for range 10000 {
		now := time.Unix(0, r.Int64N(2e18))
		for _, every := range []time.Duration{250 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Millisecond} {
			d := Until(now, every)
			if d <= 0 || d > every {
				t.Fatalf("Until(%v, %v) = %v, want in (0, %v]", now, every, d, every)
			}
			if !on(now.Add(d), every) {
				t.Fatalf("Until(%v, %v) ends off the grid", now, every)
			}
			if every == 2*time.Second && (!on(now.Add(d), time.Second) || !on(now.Add(d), 250*time.Millisecond)) {
				t.Fatalf("the 2 s grid's instant %v is not on the 1 s and 250 ms grids", now.Add(d))
			}
		}
	}
	if at := time.Unix(0, 0).Add(-Phase).Add(5 * time.Second); Until(at, time.Second) != time.Second {
		t.Errorf("on the grid, the next instant is a whole period later, got %v", Until(at, time.Second))
	}
}
