package drain

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/shaper"
)

// TestLaneQuota: SPEC §3 Quota — quota {count: 300, per: 10s} at 50/s under
// a backlog: no 10 s window holds more than 300, each fixed 10 s window
// after the first holds 300 (the quota is used in full), the lane waits
// (paused gauge 1, rate 0, Status paused with what remains) and the first
// departures after each wait are an interval apart (no burst, G2).
func TestLaneQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(50)
		cfg.Rate.Quota.Count, cfg.Rate.Quota.Per = 300, 10*time.Second
		cfg.Bucket.Capacity = 500
		h := newHarness(t, cfg, sink)
		h.src.Publish(1500)
		start := time.Now()
		h.lane.Start()
		time.Sleep(8 * time.Second) // 300 left by 6 s: waiting for the window
		st := h.lane.Status(time.Now())
		h.lane.mu.Lock()
		held := h.lane.pacer.Held()
		h.lane.mu.Unlock()
		if !held {
			t.Errorf("the pacer is not held during the quota wait: the lane would not cool (warmup)")
		}
		paused, rate := testutil.ToFloat64(h.m.Paused), testutil.ToFloat64(h.m.RateLimit)
		if st.State != StatePaused || !st.QuotaWait || st.QuotaRemaining != 0 || st.Rate != 0 || paused != 1 || rate != 0 {
			t.Errorf("during the quota wait: state %s quota_wait %v remaining %d rate %v; gauges paused %v rate %v",
				st.State, st.QuotaWait, st.QuotaRemaining, st.Rate, paused, rate)
		}
		if !st.PausedUntil.Equal(start.Add(10*time.Second + shaper.QuotaMargin)) {
			t.Errorf("paused until %v after start, want 10.002s (the first departure leaves the window)", st.PausedUntil.Sub(start))
		}
		time.Sleep(32 * time.Second)
		synctest.Wait()
		st = h.lane.Status(time.Now())
		h.stop(time.Millisecond)
		ts := times(sink.snapshot())
		if n := maxInWindow(ts, 10*time.Second); n > 300 {
			t.Errorf("%d departures in a 10 s window, want ≤ 300", n)
		}
		for w := 1; w < 4; w++ {
			n := 0
			for _, x := range ts {
				if d := x.Sub(start); d >= time.Duration(w)*10*time.Second && d < time.Duration(w+1)*10*time.Second {
					n++
				}
			}
			if n != 300 {
				t.Errorf("window %d (%ds–%ds) holds %d, want 300 (the quota in full)", w, w*10, w*10+10, n)
			}
		}
		// On the fake clock nothing is late: every gap is the interval,
		// also after each quota wait (a wait made up as lateness would give
		// gaps of 0.95 interval; released as credit, a burst).
		for i := 1; i < len(ts); i++ {
			if g := ts[i].Sub(ts[i-1]); g < 20*time.Millisecond {
				t.Fatalf("gap %d = %v at %v, under the interval (20 ms): the wait was made up", i, g, ts[i].Sub(start))
			}
		}
		if n := maxInWindow(ts, time.Second); n > 51 {
			t.Errorf("%d in a 1 s window, want ≤ 51 (G1)", n)
		}
		if st.QuotaRemaining < 0 || st.QuotaRemaining > 300 {
			t.Errorf("quota remaining %d", st.QuotaRemaining)
		}
	})
}

// TestLaneQuotaOffAndReload: without a quota Status says -1; a reload that
// sets one applies it from the next departure, counting the departures of
// the window before the reload.
func TestLaneQuotaOffAndReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(50)
		h := newHarness(t, cfg, sink)
		h.src.Publish(400)
		start := time.Now()
		h.lane.Start()
		time.Sleep(2*time.Second - time.Millisecond) // 100 departures
		if st := h.lane.Status(time.Now()); st.QuotaRemaining != -1 {
			t.Errorf("no quota: remaining %d, want -1", st.QuotaRemaining)
		}
		cfg.Rate.Quota.Count, cfg.Rate.Quota.Per = 150, 10*time.Second
		if err := h.lane.Update(cfg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(6 * time.Second)
		n := len(sink.snapshot())
		h.stop(time.Millisecond)
		// The ring starts at the reload: the 100 before it are not known to
		// it (a reload is not a replay), so 150 more may leave.
		if n != 250 {
			t.Errorf("%d calls by 8 s after a reload to 150/10s at 2 s, want 250", n)
		}
		_ = start
	})
}

// TestLaneQuotaWaitIsNotLateness: the quota's wait is not lateness for the
// pacer to make up. A lane at 50/s spends its quota of 100 per 5 s by 2 s; a
// reload lowers the rate to 10/s while it waits; when the window renews the
// departures leave 100 ms apart from the first one on (made up as
// lateness, the wait gave gaps of 95 ms for a while: the quota itself
// replays the 20 ms gaps of the first window, so only the pacer spaces them).
func TestLaneQuotaWaitIsNotLateness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(50)
		cfg.Rate.Quota.Count, cfg.Rate.Quota.Per = 100, 5*time.Second
		h := newHarness(t, cfg, sink)
		h.src.Publish(300)
		start := time.Now()
		h.lane.Start()
		time.Sleep(3 * time.Second)
		cfg.Rate.Limit = 10
		if err := h.lane.Update(cfg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		h.stop(time.Millisecond)
		ts := times(sink.snapshot())
		if len(ts) < 110 {
			t.Fatalf("%d calls", len(ts))
		}
		if d := ts[100].Sub(start); d != 5*time.Second+shaper.QuotaMargin {
			t.Errorf("call 101 at %v, want when the first leaves the window (5.002s)", d)
		}
		for i := 101; i < len(ts); i++ {
			if g := ts[i].Sub(ts[i-1]); g < 100*time.Millisecond {
				t.Fatalf("gap %d after the quota wait = %v, want the interval at 10/s (100 ms): the wait was made up", i, g)
			}
		}
	})
}
