package drain

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// A pull's messages reach the lane in a burst: nats.go's reader and fetch
// goroutines and the lane's fetch loop parse, hand over and admit tens of
// messages back to back, and keep both Ps of a 2-core machine busy for a
// few hundred microseconds. While a P is busy the runtime does not look at
// the network poller, where the precise waiter's timerfd expiry shows (only
// an idle P polls it, or sysmon every 10 ms), so a departure due during a
// burst left late: at 10,000/s end to end with the JetStream source, 39 of
// the 41 ms the lane fell short in one run were lateness beyond the
// make-up's lag, about 0.27 ms per pull (docs/performance.md, session 25).
// During a burst the departure loop therefore spins its short waits on
// the clock instead of parking: it keeps its P, and the burst runs on the
// other.
//
// fetchBurst holds until when a burst is expected: from a pull request
// until its first message (at most burstExpect), and burstTail after each
// message that arrived. Times are nanoseconds since burstEpoch; 0 is no
// pull in progress.
type fetchBurst struct {
	until atomic.Int64
	spun  atomic.Int64 // waits the departure loop spun (tests)
}

const (
	// burstExpect bounds the spin after a pull request while none of its
	// messages has arrived: a pull that finds the stream empty waits for
	// its expiry, and the lane must not spin meanwhile.
	burstExpect = 2 * time.Millisecond
	// burstTail is how long after a message the burst is taken to go on.
	burstTail = 100 * time.Microsecond
	// burstSpinBelow: only lanes whose limit's interval is this short
	// (above 2,000/s) spin, and only waits this short. Longer intervals
	// leave a make-up lag (MakeUpLag) that a burst's delay fits in, and
	// spinning there would cost CPU for nothing; a lane at 1,000/s that came
	// back late to a short wait on a starved machine would spin what the
	// sink and the downstream need.
	burstSpinBelow = 500 * time.Microsecond
)

var burstEpoch = time.Now()

func burstNow() int64 { return int64(time.Since(burstEpoch)) }

// expect marks a pull request sent.
func (b *fetchBurst) expect() { b.until.Store(burstNow() + int64(burstExpect)) }

// arrived marks a message of the pull, received at received (the source's
// stamp, shaper.Message.Received: no clock read per message; the clock
// when the source gave none).
func (b *fetchBurst) arrived(received time.Time) {
	if received.IsZero() {
		received = time.Now()
	}
	b.until.Store(int64(received.Sub(burstEpoch)) + int64(burstTail))
}

// end marks the pull ended.
func (b *fetchBurst) end() { b.until.Store(0) }

// spinFor reports whether a wait from now to at, at limit, should be
// spun: a burst is expected or under way, and the limit's interval and the
// wait are short. Outside a burst it costs one atomic load.
func (b *fetchBurst) spinFor(limit shaper.Limit, now, at time.Time) bool {
	u := b.until.Load() // 0: no pull in progress
	return u != 0 && at.Sub(now) < burstSpinBelow && limit.Interval() < burstSpinBelow && burstNow() < u
}

// spinUntil waits for at on the clock, holding the P (see fetchBurst); it
// returns early, woken, when a token arrives on the lane's wake channel,
// and with ctx's error when ctx ends.
func (l *Lane) spinUntil(ctx context.Context, at time.Time) (woke bool, err error) {
	l.burst.spun.Add(1)
	done := ctx.Done()
	for time.Now().Before(at) {
		select {
		case <-l.wake:
			return true, nil
		case <-done:
			return false, ctx.Err()
		default:
		}
	}
	return false, nil
}

// spinsOnTheClock reports whether the departure loop may spin on the clock
// during a burst: only beside a waiter on the real clock (realClock). On
// the fake clock of testing/synctest a spin would never see the time move
// (TimerWaiter).
func spinsOnTheClock(w Waiter) bool {
	_, ok := realClock(w)
	return ok
}
