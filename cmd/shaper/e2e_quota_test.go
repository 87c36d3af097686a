package main

import (
	"testing"
	"time"
)

// TestE2EQuota: SPEC §3 Quota, the proof — quota {count: 300, per: 10s} at
// 50/s under a backlog of 1,500: at the downstream's kernel timestamps no
// 10 s window holds more than 300, each 10 s window after the first (counted
// from the first arrival) holds 300, the lane waits while the quota is spent
// (shaper_lane_paused 1, /v1/lanes paused with quota_remaining 0) and the
// calls after each wait come one interval apart, within G1's windows.
func TestE2EQuota(t *testing.T) {
	d := newScripted(t, nil)
	daemon := startDaemon(t, laneYAML(t, "{ capacity: 400 }", "{ limit: 50/s, quota: { count: 300, per: 10s } }",
		"{ timeout: 2s, max_in_flight: 4 }", d.srv.URL+"/callback"))
	waitReady(t, daemon.AdminAddr(), 10*time.Second)
	js := connectJS(t, daemon.NATSURL())
	publishBurst(t, js, "e2e.sem.job", 1500)
	deadline := time.Now().Add(10 * time.Second)
	for len(d.snapshot()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no call within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	first := d.snapshot()[0].at
	time.Sleep(time.Until(first.Add(8 * time.Second))) // 300 by 6 s, then the wait
	paused := metricValue(t, scrape(t, daemon.AdminAddr()), "shaper_lane_paused", map[string]string{"lane": "sem"})
	view := apiLane(t, daemon.AdminAddr(), "sem")
	time.Sleep(time.Until(first.Add(37 * time.Second)))
	after := apiLane(t, daemon.AdminAddr(), "sem")
	calls := d.snapshot()
	ts := make([]time.Time, len(calls))
	for i, c := range calls {
		ts[i] = c.at
	}
	n, at := maxInWindow(ts, 10*time.Second)
	per := []int{0, 0, 0, 0}
	for _, x := range ts {
		if w := int(x.Sub(first) / (10 * time.Second)); w < len(per) {
			per[w]++
		}
	}
	t.Logf("%d calls; most in a 10 s window: %d (from %v); per 10 s window from the first call: %v; during the wait: paused %v, state %q, quota_remaining %v; at 37 s quota_remaining %v",
		len(ts), n, at.Sub(first), per, paused, view.State, deref(view.QuotaRemaining), deref(after.QuotaRemaining))
	if len(ts) > 300 {
		t.Logf("call 300 arrived %v after call 0", ts[300].Sub(first))
	}
	if n > 300 {
		t.Errorf("%d calls in the 10 s window from %v, want ≤ 300", n, at.Sub(first))
	}
	for w := 1; w < len(per); w++ {
		if per[w] != 300 {
			t.Errorf("window %d (%d–%d s) holds %d, want 300 (the quota used in full)", w, 10*w, 10*w+10, per[w])
		}
	}
	if paused != 1 || view.State != "paused" || view.QuotaRemaining == nil || *view.QuotaRemaining != 0 || view.PauseReason != "quota spent" {
		t.Errorf("during the wait: shaper_lane_paused %v, /v1/lanes state %q reason %q quota_remaining %v; want 1, paused, quota spent, 0",
			paused, view.State, view.PauseReason, deref(view.QuotaRemaining))
	}
	if n, at := maxInWindow(ts, time.Second); n > 51 {
		t.Errorf("%d calls in the 1 s window at %v, above G1's 51", n, at.Sub(first))
	}
	for i := 1; i < len(ts); i++ {
		if g := ts[i].Sub(ts[i-1]); g < 18*time.Millisecond { // 0.95 × 20 ms, less loopback jitter
			t.Errorf("gap %d = %v at %v: under 0.95 interval, a burst", i, g, ts[i].Sub(first))
		}
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}
