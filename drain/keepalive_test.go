package drain

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/internal/tick"
)

// TestHouseLoopStretchesWhenQuiet (issue 15: an idle daemon costs nothing;
// keepalive.go): a quiet lane's house loop wakes every houseIdleEvery, not
// every houseEvery, and an admission brings the short period back at once.
// The stale gauge shows which period runs: the loop rewrites it each time.
func TestHouseLoopStretchesWhenQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(100)
		cfg.Rate.Warmup.ColdFactor = 1 // no ramp: the rate is steady from the start
		sink := &recSink{}
		h := newHarness(t, cfg, sink)
		h.lane.Start()
		time.Sleep(10 * time.Second) // quiet: the period has doubled up to houseIdleEvery
		synctest.Wait()
		if !h.lane.houseSlow.Load() {
			t.Fatal("after 10 s without traffic the house loop still runs every houseEvery")
		}
		// Just after a tick of the grid of houseIdleEvery (internal/tick),
		// a stale gauge stays stale until the next one.
		time.Sleep(tick.Until(time.Now(), houseIdleEvery) + time.Millisecond)
		synctest.Wait()
		h.m.BucketDepth.Set(99) // stale: the next house tick sets it again
		time.Sleep(houseIdleEvery - 2*time.Millisecond)
		synctest.Wait()
		stale := testutil.ToFloat64(h.m.BucketDepth)
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if stale != 99 {
			t.Errorf("the quiet lane's house loop woke within %v of its last tick", houseIdleEvery-2*time.Millisecond)
		}
		if got := testutil.ToFloat64(h.m.BucketDepth); got != 0 {
			t.Errorf("bucket depth gauge %v after houseIdleEvery, want 0", got)
		}

		// A message: the short period at once.
		h.src.Publish(1)
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if h.lane.houseSlow.Load() {
			t.Error("an admission left the house loop's period stretched")
		}
		if n := len(sink.snapshot()); n != 1 {
			t.Errorf("%d deliveries, want 1", n)
		}
		h.stop(time.Second)
	})
}

// TestQuietHouseLoopsTickTogether: two lanes that start (or last had
// traffic) 370 ms apart tick on the same instants once quiet, those of the
// process's grid of houseIdleEvery (internal/tick), so one wake-up of an
// idle daemon serves every lane.
func TestQuietHouseLoopsTickTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(100)
		cfg.Rate.Warmup.ColdFactor = 1
		a := newHarness(t, cfg, &recSink{})
		b := newHarness(t, cfg, &recSink{})
		a.lane.Start()
		time.Sleep(370 * time.Millisecond)
		b.lane.Start()
		b.src.Publish(1) // b's traffic, 370 ms after a started
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if !a.lane.houseSlow.Load() || !b.lane.houseSlow.Load() {
			t.Fatal("after 10 s without traffic a house loop still runs every houseEvery")
		}
		for i := range 3 {
			next := tick.Until(time.Now(), houseIdleEvery)
			time.Sleep(next - time.Millisecond)
			synctest.Wait()
			a.m.BucketDepth.Set(99)
			b.m.BucketDepth.Set(99)
			time.Sleep(2 * time.Millisecond)
			synctest.Wait()
			if ga, gb := testutil.ToFloat64(a.m.BucketDepth), testutil.ToFloat64(b.m.BucketDepth); ga != 0 || gb != 0 {
				t.Errorf("grid instant %d: bucket depth gauges %v and %v 1 ms after it, want both set again (0)", i, ga, gb)
			}
		}
		a.stop(time.Second)
		b.stop(time.Second)
	})
}

// TestHoldEndShownAtOnce: the gauges show the end of a timed operator hold
// when it comes, on a lane idle long enough for a stretched house period:
// paused 0 and the rate back together, not a period later (found by a
// new-user pass: for half a second after the end the metrics read "not
// paused, rate 0").
func TestHoldEndShownAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(20)
		cfg.Rate.Warmup.ColdFactor = 1
		h := newHarness(t, cfg, &recSink{})
		h.lane.Start()
		time.Sleep(30 * time.Second) // idle: the house period is stretched
		synctest.Wait()
		h.lane.Hold(Hold{Until: time.Now().Add(2*time.Second + 300*time.Millisecond), Reason: "test"})
		synctest.Wait()
		if p := testutil.ToFloat64(h.m.Paused); p != 1 {
			t.Fatalf("paused gauge %v during the hold, want 1", p)
		}
		time.Sleep(2*time.Second + 301*time.Millisecond)
		synctest.Wait()
		if p, r := testutil.ToFloat64(h.m.Paused), testutil.ToFloat64(h.m.RateLimit); p != 0 || r != 20 {
			t.Errorf("1 ms after the hold's end: paused %v, rate %v; want 0 and 20", p, r)
		}
		h.stop(time.Second)
	})
}

// TestHouseLoopShortWhileInFlight: a task in flight keeps the short period
// (the lane is not quiet although its bucket is empty).
func TestHouseLoopShortWhileInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(100)
		cfg.Rate.Warmup.ColdFactor = 1
		cfg.Task.Timeout = 20 * time.Second
		h := newHarness(t, cfg, &recSink{behave: func(call) (time.Duration, error) { return 10 * time.Second, nil }})
		h.src.Publish(1)
		h.lane.Start()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if h.lane.houseSlow.Load() {
			t.Error("the house period stretched while a task was in flight")
		}
		time.Sleep(6 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
	})
}

// TestHouseLoopShortWhileHolding: messages waiting in the bucket keep the
// short period, so that bucket.max_age expires them on time while the
// departure loop sleeps until its next departure (here 10 s away).
func TestHouseLoopShortWhileHolding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(0.1)
		cfg.Rate.Warmup.ColdFactor = 1
		cfg.Bucket.MaxAge = 3 * time.Second
		h := newHarness(t, cfg, &recSink{})
		h.src.Publish(3)
		h.lane.Start()
		time.Sleep(3*time.Second + 300*time.Millisecond)
		synctest.Wait()
		if n := len(h.dead.snapshot()); n != 2 {
			t.Errorf("%d dead letters 0.3 s after max_age, want the 2 messages still held", n)
		}
		h.stop(time.Second)
	})
}

// TestReloadShownOnIdleLane: a reload of a quiet lane's rate reaches the
// rate gauge within the short period, not the stretched one (Update
// nudges the house loop).
func TestReloadShownOnIdleLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(20)
		cfg.Rate.Warmup.ColdFactor = 1
		h := newHarness(t, cfg, &recSink{})
		h.lane.Start()
		time.Sleep(30 * time.Second) // idle: the house period is stretched
		synctest.Wait()
		cfg.Rate.Limit = 40
		if err := h.lane.Update(cfg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(houseEvery + time.Millisecond)
		synctest.Wait()
		if r := testutil.ToFloat64(h.m.RateLimit); r != 40 {
			t.Errorf("rate gauge %v %v after the reload to 40/s, want 40", r, houseEvery)
		}
		h.stop(time.Second)
	})
}
