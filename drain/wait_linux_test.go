package drain

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// TestPreciseWaiterInterrupts: a wake token interrupts a wait at once, a
// token sent between waits makes the next one return at once, ctx cancels,
// and Unbind stops the watcher goroutine. Bounds are wide: real clock.
func TestPreciseWaiterInterrupts(t *testing.T) {
	before := runtime.NumGoroutine()
	w := NewPreciseWaiter()
	w.Bind()
	wake := make(chan struct{}, 1)
	ctx := context.Background()

	// Reaches its time (and not much later).
	target := time.Now().Add(20 * time.Millisecond)
	if woke, err := w.Wait(ctx, target, wake); woke || err != nil {
		t.Fatalf("plain wait: woke %v err %v", woke, err)
	}
	if late := time.Since(target); late < 0 || late > 50*time.Millisecond {
		t.Errorf("plain wait returned %v after its time", late)
	}

	// A token during the wait interrupts it.
	go func() { time.Sleep(10 * time.Millisecond); wake <- struct{}{} }()
	start := time.Now()
	if woke, err := w.Wait(ctx, start.Add(5*time.Second), wake); !woke || err != nil {
		t.Fatalf("wake during the wait: woke %v err %v", woke, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the wake token took %v to interrupt", d)
	}

	// A token between waits makes the next Wait return at once.
	wake <- struct{}{}
	time.Sleep(20 * time.Millisecond) // the watcher takes it
	start = time.Now()
	if woke, _ := w.Wait(ctx, start.Add(5*time.Second), wake); !woke || time.Since(start) > 2*time.Second {
		t.Errorf("pending token: woke %v after %v", woke, time.Since(start))
	}

	// ctx ends the wait.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := w.Wait(cctx, time.Now().Add(5*time.Second), wake); err == nil {
		t.Error("a cancelled ctx did not end the wait")
	}

	// ctx alone (no wake channel) ends a wait too, and a fresh ctx after
	// a cancelled one waits normally.
	cctx2, cancel2 := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel2()
	start = time.Now()
	if _, err := w.Wait(cctx2, start.Add(5*time.Second), nil); err == nil || time.Since(start) > 2*time.Second {
		t.Errorf("ctx without a wake channel: err %v after %v", err, time.Since(start))
	}
	cctx3, cancel3 := context.WithCancel(ctx)
	target = time.Now().Add(5 * time.Millisecond)
	if woke, err := w.Wait(cctx3, target, nil); woke || err != nil || time.Since(target) < 0 {
		t.Errorf("wait after a cancelled ctx: woke %v err %v, %v after its time", woke, err, time.Since(target))
	}
	cancel3()

	w.Unbind()
	deadline := time.Now().Add(time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Unbind, %d before: the watcher outlived it", n, before)
	}
}

// waitLateness runs the departure loop of a lane (Pacer.Next, Wait, Depart)
// at 1,000/s on the real clock for d, under a cancellable ctx and with a wake
// channel as the lane passes them, and returns how late each timed wait
// returned against the instant it was asked for, sorted.
func waitLateness(t *testing.T, w Waiter, d time.Duration) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wake := make(chan struct{}, 1)
	w.Bind()
	defer w.Unbind()
	p := shaper.NewPacer(shaper.PacerConfig{Limit: 1000}, time.Now())
	late := make([]time.Duration, 0, int(d/time.Millisecond)+16)
	for start := time.Now(); time.Since(start) < d; {
		ready := time.Now()
		now := ready
		for {
			at := p.Next(now)
			if !at.After(now) {
				break
			}
			if _, err := w.Wait(ctx, at, wake); err != nil {
				t.Fatal(err)
			}
			now = time.Now()
			late = append(late, now.Sub(at))
		}
		p.Depart(ready, now)
	}
	slices.Sort(late)
	return late
}

// TestPreciseWaiterBeatsTimer: at 1,000/s on the real clock for 2 s, the
// median lateness of the precise waiter stays under 20 µs. A plain
// time.Timer cannot meet that here: Go sleeps sub-millisecond waits for
// ~1.05–1.1 ms (epoll_wait's millisecond timeout, NOTES.md), so
// TimerWaiter{} in its place has a median of ~140 µs (measured: 137–151 µs
// idle, under -race and with a CPU hog on the other core), while the precise
// waiter's is ~0.1–0.2 µs in the same conditions (it spins its last µs for
// more than half of the wake-ups by design, earlyQuantile). The median, not
// the mean or the max: a loaded 2-core machine stalls a few wake-ups by
// milliseconds whatever the waiter.
func TestPreciseWaiterBeatsTimer(t *testing.T) {
	if testing.Short() {
		t.Skip("real clock, 2 s")
	}
	const bound = 20 * time.Microsecond
	late := waitLateness(t, NewPreciseWaiter(), 2*time.Second)
	if len(late) < 1000 {
		t.Fatalf("only %d timed waits in 2 s at 1,000/s", len(late))
	}
	q := func(p float64) time.Duration { return late[min(int(p*float64(len(late))), len(late)-1)] }
	t.Logf("%d timed waits; lateness p10 %v, p50 %v, p90 %v, p99 %v, max %v",
		len(late), q(0.1), q(0.5), q(0.9), q(0.99), late[len(late)-1])
	if med := q(0.5); med > bound {
		t.Errorf("median lateness %v above %v: no better than a plain timer", med, bound)
	}
}

// TestPreciseWaiterKeepsLearning: an estimate of the wake-up latency pushed
// to its cap (a machine busy for a while) comes back down at 10,000/s-style
// waits of 100 µs instead of spinning them whole for good.
func TestPreciseWaiterKeepsLearning(t *testing.T) {
	w := NewPreciseWaiter().(*PreciseWaiter)
	w.Bind()
	defer w.Unbind()
	w.early = maxEarly
	ctx := context.Background()
	next := time.Now()
	for range 2000 {
		next = next.Add(100 * time.Microsecond)
		if now := time.Now(); next.Before(now) {
			next = now.Add(100 * time.Microsecond)
		}
		if _, err := w.Wait(ctx, next, nil); err != nil {
			t.Fatal(err)
		}
	}
	if w.early > maxEarly/2 {
		t.Errorf("estimate still %v after 2,000 waits of 100 µs (cap %v): it stopped learning", w.early, maxEarly)
	}
}
