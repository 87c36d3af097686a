package sources

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/tick"
	"github.com/shaper-dev/shaper/shaper"
)

// TestPullExpiryAligns: a pull's expiry ends on the process's grid of
// whole FetchExpiry (or on its half, once), lies between a quarter of
// FetchExpiry and FetchExpiry, and a chain of pulls, each sent a little
// after the last one expired, is on the grid from its second pull on, so
// the quiet lanes of a process renew their pulls together.
func TestPullExpiryAligns(t *testing.T) {
	const g = FetchExpiry
	onGrid := func(at time.Time, every time.Duration) bool {
		return (at.UnixNano()+int64(tick.Phase))%int64(every) == 0
	}
	base := time.Unix(1_800_000_000, 0)
	base = base.Add(tick.Until(base, g)) // on the grid
	for _, c := range []struct {
		after, want time.Duration // now = a grid instant + after
	}{
		{0, g},
		{time.Millisecond, 999 * time.Millisecond},
		{400 * time.Millisecond, 600 * time.Millisecond},
		{500 * time.Millisecond, 500 * time.Millisecond},
		{600 * time.Millisecond, 400 * time.Millisecond},
		{750 * time.Millisecond, 250 * time.Millisecond},
		{751 * time.Millisecond, 749 * time.Millisecond},
		{999 * time.Millisecond, 501 * time.Millisecond},
	} {
		now := base.Add(c.after)
		if got := pullExpiry(now); got != c.want {
			t.Errorf("a pull sent %v after a grid instant expires after %v, want %v", c.after, got, c.want)
		}
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for range 1000 {
		now := base.Add(time.Duration(r.Int64N(int64(10 * g))))
		for i := range 4 {
			d := pullExpiry(now)
			if d < g/4 || d > g {
				t.Fatalf("expiry %v from %v, want between %v and %v", d, now, g/4, g)
			}
			end := now.Add(d)
			if !onGrid(end, g/2) || (i >= 1 && !onGrid(end, g)) {
				t.Fatalf("pull %d of a chain sent at %v expires at %v, off the grid", i, now, end)
			}
			now = end.Add(time.Duration(r.Int64N(int64(5 * time.Millisecond)))) // the next pull, a round trip later
		}
	}
}

// TestQuietPullsExpireTogether: the pulls of two quiet sources (lanes) on
// one server end on the process's grid (pullExpiry), so that one wake-up
// serves both: after its first pull, each empty pull of either source ends
// within a few milliseconds after a grid instant.
func TestQuietPullsExpireTogether(t *testing.T) {
	js := testJetStream(t)
	ctx := context.Background()
	ends := make([][]time.Time, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		src, err := NewJetStream(ctx, js, JetStreamConfig{Stream: fmt.Sprintf("QUIET%d", i), Subjects: []string{fmt.Sprintf("quiet%d.>", i)},
			Durable: "q", AckWait: time.Minute}, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == 1 {
				time.Sleep(370 * time.Millisecond) // off the grid of the other
			}
			for range 3 {
				if err := src.Fetch(ctx, 10, func(*shaper.Message) { t.Error("a message in an empty stream") }); err != nil {
					t.Error(err)
					return
				}
				ends[i] = append(ends[i], time.Now())
			}
		}()
	}
	wg.Wait()
	for i, e := range ends {
		for k, at := range e[1:] {
			past := time.Duration((at.UnixNano() + int64(tick.Phase)) % int64(FetchExpiry))
			if past > 50*time.Millisecond {
				t.Errorf("source %d: pull %d ended %v past the grid, want within 50ms (ends %v)", i, k+1, past, e)
			}
		}
	}
}
