package testserver

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRedisSteppableClock: redis-server runs under libfaketime (with
// tcmalloc preloaded) and its TIME follows StepClock at once, back and
// ahead, while the server keeps answering.
func TestRedisSteppableClock(t *testing.T) {
	r := StartRedis(t, WithSteppableClock(t))
	serverNow := func() time.Time {
		var ts time.Time
		if err := client(r.Addr, func(ctx context.Context, rc *redis.Client) (err error) {
			ts, err = rc.Time(ctx).Result()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ts
	}
	for _, step := range []time.Duration{0, -5 * time.Second, 0, 5 * time.Second} {
		r.StepClock(step)
		if got := serverNow().Sub(time.Now()); (got - step).Abs() > 100*time.Millisecond {
			t.Errorf("after StepClock(%v) the server's clock is %v off the real one", step, got.Round(time.Millisecond))
		}
	}
}
