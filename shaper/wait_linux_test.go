package shaper

import (
	"context"
	"runtime"
	"testing"
	"time"
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

	w.Unbind()
	deadline := time.Now().Add(time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Unbind, %d before: the watcher outlived it", n, before)
	}
}
