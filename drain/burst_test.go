package drain

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// TestFetchBurstSpinFor: the departure loop spins a wait only while a
// pull's messages are expected (up to burstExpect after the request) or
// arriving (burstTail after each), and only a wait shorter than
// burstSpinBelow of a lane whose interval is shorter than that (burst.go).
func TestFetchBurstSpinFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b fetchBurst
		const limit = shaper.Limit(10000)
		short := func() bool { now := time.Now(); return b.spinFor(limit, now, now.Add(100*time.Microsecond)) }
		long := func() bool { now := time.Now(); return b.spinFor(limit, now, now.Add(burstSpinBelow)) }
		slowLane := func() bool { now := time.Now(); return b.spinFor(1000, now, now.Add(100*time.Microsecond)) }
		if short() {
			t.Error("spun before any pull")
		}
		b.expect()
		if !short() || long() || slowLane() {
			t.Errorf("after a pull request: short wait spun %v (want true), a wait of burstSpinBelow %v (want false), a short wait at 1,000/s %v (want false)",
				short(), long(), slowLane())
		}
		time.Sleep(burstExpect)
		if short() {
			t.Error("spun burstExpect after a pull request with no message (a pull that finds the stream empty)")
		}
		b.arrived(time.Now())
		time.Sleep(burstTail - time.Microsecond)
		if !short() {
			t.Error("did not spin within burstTail of a message")
		}
		time.Sleep(time.Microsecond)
		if short() {
			t.Error("spun burstTail after the last message")
		}
		b.expect()
		b.end()
		if short() {
			t.Error("spun after the pull ended")
		}
		b.arrived(time.Time{}) // a source that stamps no Received: the clock
		if !short() {
			t.Error("did not spin after a message without a receive stamp")
		}
	})
}

// TestLaneSpinUntil: a spun wait returns at its instant, at once for a wake
// token (woke), and with ctx's error when ctx ends.
func TestLaneSpinUntil(t *testing.T) {
	l := &Lane{wake: make(chan struct{}, 1)}
	at := time.Now().Add(300 * time.Microsecond)
	if woke, err := l.spinUntil(context.Background(), at); woke || err != nil || time.Now().Before(at) {
		t.Errorf("spinUntil = %v, %v, returned %v before its instant", woke, err, at.Sub(time.Now()))
	}
	l.wake <- struct{}{}
	if woke, err := l.spinUntil(context.Background(), time.Now().Add(time.Second)); !woke || err != nil {
		t.Errorf("with a wake token: %v, %v; want woke", woke, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.spinUntil(ctx, time.Now().Add(time.Second)); err == nil {
		t.Error("an ended ctx: no error")
	}
	if got := l.burst.spun.Load(); got != 3 {
		t.Errorf("spun %d waits, want 3", got)
	}
}

// TestSpinsOnTheClock: only the precise waiter (or a wrapper of it) spins
// on the clock during a burst; TimerWaiter, the fake clock's, never does.
func TestSpinsOnTheClock(t *testing.T) {
	if spinsOnTheClock(TimerWaiter{}) {
		t.Error("TimerWaiter spins: on synctest's fake clock a spin would never end")
	}
	p := NewPreciseWaiter()
	if _, want := p.(alarmMaker); spinsOnTheClock(p) != want || spinsOnTheClock(wrapWaiter{p}) != want {
		t.Errorf("precise waiter: spins %v, wrapped %v; want %v", spinsOnTheClock(p), spinsOnTheClock(wrapWaiter{p}), want)
	}
}

type wrapWaiter struct{ Waiter }

func (w wrapWaiter) Unwrap() Waiter { return w.Waiter }
