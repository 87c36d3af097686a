package drain

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// slowBurstSource delivers each pull's messages 40 µs apart (the handing
// over and admission of a JetStream pull, slowed down), each stamped
// Received when it arrives, as the JetStream source stamps it (stamped
// before the 40 µs, a message left the burst only 60 µs of tail, and 2 of
// 10 runs here saw 21–22 waits in bursts where most saw 60–120; stamped on
// arrival, 126–178 in 20 runs), and counts the messages whose arrival the
// lane did not mark in its burst: fetch.go calls fetchBurst.arrived with
// each message's receive stamp, and only the fetch loop, whose callback
// this is, writes the burst.
type slowBurstSource struct {
	Source
	burst    *fetchBurst
	unmarked *atomic.Int64
}

func (s slowBurstSource) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	return s.Source.Fetch(ctx, max, func(m *shaper.Message) {
		for end := time.Now().Add(40 * time.Microsecond); time.Now().Before(end); {
		}
		m.Received = time.Now() // arrived now, as the JetStream source stamps it
		deliver(m)
		if s.burst.until.Load() != int64(m.Received.Sub(burstEpoch)+burstTail) {
			s.unmarked.Add(1)
		}
	})
}

// parkWatch wraps the lane's waiter and counts the waits the departure
// loop parked, and those of them it parked while a pull's burst was under
// way (the burst state read as spinFor reads it).
type parkWatch struct {
	Waiter
	burst         *fetchBurst
	parked        atomic.Int64
	parkedInBurst atomic.Int64
}

func (w *parkWatch) Unwrap() Waiter { return w.Waiter }

func (w *parkWatch) Wait(ctx context.Context, at time.Time, wake <-chan struct{}) (bool, error) {
	w.parked.Add(1)
	if u := w.burst.until.Load(); u != 0 && burstNow() < u && time.Until(at) < burstSpinBelow {
		w.parkedInBurst.Add(1)
	}
	return w.Waiter.Wait(ctx, at, wake)
}

// TestLaneSpinsItsWaitsDuringABurst: a lane at 5,000/s with the precise
// waiter spins its waits while a pull's messages arrive (burst.go), and
// parks them otherwise. With pulls of 5 to 20 messages, 0.2 to 0.8 ms
// each, about a fifth of its waits fall in a burst. How many do depends on
// the machine's load (a starved departure loop is late and makes fewer
// waits: 38 of 400 in a CI run, where at least 40 spun was asserted), so
// the test counts them: at least 40 waits fall in bursts, and at most one
// in ten of those is parked (a pull can begin between the loop's look at the
// burst and its wait: 0-3 of 80 to 240 in 25 runs here, idle or with
// both cores busy elsewhere).
func TestLaneSpinsItsWaitsDuringABurst(t *testing.T) {
	cfg := laneConfig(5000)
	cfg.Bucket.Capacity = 20
	cfg.Rate.Warmup = config.Warmup{ColdFactor: 1}
	w := &parkWatch{Waiter: NewPreciseWaiter()}
	h := waiterHarness(t, cfg, &recSink{}, w)
	w.burst = &h.lane.burst
	src := h.src
	var unmarked atomic.Int64
	h.lane.src = slowBurstSource{Source: src, burst: &h.lane.burst, unmarked: &unmarked}
	const n = 1000
	src.Publish(n)
	h.lane.Start()
	h.waitAcked(n, 10*time.Second)
	h.stop(5 * time.Second)
	spun, parked, parkedInBurst := h.lane.burst.spun.Load(), w.parked.Load(), w.parkedInBurst.Load()
	t.Logf("of %d waits: %d spun, %d parked during a burst, %d parked outside one", spun+parked, spun, parkedInBurst, parked-parkedInBurst)
	if inBurst := spun + parkedInBurst; inBurst < 40 {
		t.Errorf("only %d of the departure loop's waits fell in a burst, want at least 40 (spun %d, parked %d)", inBurst, spun, parkedInBurst)
	}
	if parkedInBurst*10 > spun+parkedInBurst {
		t.Errorf("the departure loop parked %d of its %d waits during bursts, want at most one in ten (spun %d)", parkedInBurst, spun+parkedInBurst, spun)
	}
	if got := unmarked.Load(); got != 0 {
		t.Errorf("%d of %d messages arrived unmarked: the burst must last until burstTail past each message's receive stamp", got, n)
	}
}
