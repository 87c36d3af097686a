package drain

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/config"
)

// TestCase_C27_PerMessagePacingMovesMetrics is CASES.md C27 (vector PR
// #10526: a sink's rate limit slept once per batch of 1,024 events, and at
// 1/s its metrics did not move for more than 17 minutes). At 1/s, 256
// messages fetched at once into a bucket of 256 leave one at a time, 0.99–
// 1.01 s apart, and a scrape every second sees the lane move: at t = 10 s
// 9–11 delivered, 245–247 in the bucket, and as many queue waits observed as
// deliveries, at every scrape.
func TestCase_C27_PerMessagePacingMovesMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(1)
		cfg.Bucket.Capacity = 256
		cfg.Rate.Warmup = config.Warmup{ColdFactor: 1} // no ramp
		sink := &recSink{}
		h := newHarness(t, cfg, sink)
		h.src.Publish(256)
		start := time.Now()
		h.lane.Start()
		prev := -1.0
		for k := 1; k <= 10; k++ {
			time.Sleep(time.Until(start.Add(time.Duration(k)*time.Second + 500*time.Millisecond)))
			synctest.Wait()
			delivered := testutil.ToFloat64(h.m.Deliveries["success"])
			depth := testutil.ToFloat64(h.m.BucketDepth)
			waits := histCount(t, h.reg, "shaper_queue_wait_seconds", "")
			if delivered <= prev {
				t.Errorf("scrape at %d.5 s: %v delivered, no more than at the scrape before (%v): the metrics froze", k, delivered, prev)
			}
			if waits != uint64(delivered) {
				t.Errorf("scrape at %d.5 s: %d queue waits observed, %v delivered", k, waits, delivered)
			}
			if k == 10 {
				if delivered < 9 || delivered > 11 {
					t.Errorf("at t = 10 s: %v delivered, want 9–11", delivered)
				}
				if depth < 245 || depth > 247 {
					t.Errorf("at t = 10 s: bucket depth %v, want 245–247", depth)
				}
			}
			prev = delivered
		}
		h.stop(time.Second)
		cs := sink.snapshot()
		for i := 1; i < len(cs); i++ {
			if g := cs[i].at.Sub(cs[i-1].at); g < 990*time.Millisecond || g > 1010*time.Millisecond {
				t.Errorf("gap %d = %v, want 0.99–1.01 s", i, g)
			}
		}
	})
}
