package redisslots

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/internal/testserver"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/shaper/shapertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startRedis starts a real redis-server for t (internal/testserver: skipped
// without the binary, a failure under CI=true).
func startRedis(t testing.TB) *testserver.Redis { return testserver.StartRedis(t) }

// newSlots returns a RedisSlots for addr with the given options, closed at
// the end of the test, with the script loaded.
func newSlots(t *testing.T, addr string, opts ...RedisOption) *RedisSlots {
	t.Helper()
	rs, err := NewRedisSlots(config.Redis{Addr: addr, KeyPrefix: "test", Timeout: 50 * time.Millisecond, ReplicasHint: 1}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rs.Load(ctx); err != nil {
		t.Fatal(err)
	}
	return rs
}

// maxIn returns the largest number of sorted instants in a half-open window
// [t, t+w).
func maxIn(ts []time.Time, w time.Duration) int {
	n, _ := shapertest.MaxInWindow(ts, w)
	return n
}

// maxInClosed returns the largest number of sorted instants in a closed
// window [t, t+w].
func maxInClosed(ts []time.Time, w time.Duration) int {
	n, _ := shapertest.MaxInClosedWindow(ts, w)
	return n
}

// sleepUntil sleeps until t (about 1 ms late, as Go's timers are here).
func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// slotReq is a reservation at interval iv with no slack and the default
// min_spacing.
func slotReq(iv time.Duration) drain.SlotRequest {
	return drain.SlotRequest{Interval: iv, MinSpacing: shaper.DefaultMinSpacing}
}
