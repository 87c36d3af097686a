package drain

import (
	"context"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// slowBurstSource delivers each pull's messages 40 µs apart (the handing
// over and admission of a JetStream pull, slowed down).
type slowBurstSource struct{ Source }

func (s slowBurstSource) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	return s.Source.Fetch(ctx, max, func(m *shaper.Message) {
		for end := time.Now().Add(40 * time.Microsecond); time.Now().Before(end); {
		}
		deliver(m)
	})
}

// TestLaneSpinsItsWaitsDuringABurst: a lane at 5,000/s with the precise
// waiter spins its waits while a pull's messages arrive (burst.go), and
// parks them otherwise: with pulls of 10 messages, 0.4 ms each, most of
// its waits fall in a burst.
func TestLaneSpinsItsWaitsDuringABurst(t *testing.T) {
	cfg := laneConfig(5000)
	cfg.Bucket.Capacity = 20
	cfg.Rate.Warmup = config.Warmup{ColdFactor: 1}
	h := preciseHarness(t, cfg, &recSink{})
	src := h.src
	h.lane.src = slowBurstSource{src}
	src.Publish(400)
	h.lane.Start()
	h.waitAcked(400, 10*time.Second)
	h.stop(5 * time.Second)
	if got := h.lane.burst.spun.Load(); got < 40 {
		t.Errorf("the departure loop spun %d of its 400 waits during bursts, want at least 40", got)
	}
}
