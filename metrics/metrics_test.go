package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSeriesExistFromStart: SPEC §6 — every series of every configured lane
// and every listed label value exists from start with value 0.
func TestSeriesExistFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Lane("payments", 100)
	m.Lane("refunds", 10)
	want := map[string]int{ // series per lane
		"shaper_bucket_depth_messages": 1, "shaper_bucket_capacity_messages": 1, "shaper_rate_limit_per_second": 1,
		"shaper_in_flight_tasks": 1, "shaper_admitted_messages_total": 1, "shaper_departures_total": 1,
		"shaper_deliveries_total": len(DeliveryOutcomes), "shaper_dead_letters_total": len(DeadLetterReasons),
		"shaper_queue_wait_seconds": 1, "shaper_task_duration_seconds": len(TaskOutcomes),
		"shaper_lane_paused": 1, "shaper_global_limiter_fallback": 1,
		"shaper_global_slots_dropped_total": 1, "shaper_global_schedule_delayed_seconds_total": 1,
		"shaper_departure_lateness_forgiven_seconds_total": 2, // late, wire
		"shaper_departures_overtaken_total":                1,
		"shaper_retries_total":                             len(RetryReasons), "shaper_redelivered_messages_total": 1,
		LatenessName: 1, GapName: 1, "shaper_breaker_open": 1,
		"shaper_fair_active_keys": 1, "shaper_fair_queue_wait_seconds": len(FairClasses),
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	process := map[string]bool{ // not per lane: one series each
		"shaper_config_last_reload_successful": true, "shaper_config_last_reload_success_timestamp_seconds": true}
	for _, mf := range mfs {
		if process[mf.GetName()] {
			if n := len(mf.GetMetric()); n != 1 {
				t.Errorf("%s: %d series, want 1", mf.GetName(), n)
			}
			delete(process, mf.GetName())
			continue
		}
		got[mf.GetName()] = len(mf.GetMetric())
		for _, s := range mf.GetMetric() {
			if v := s.GetGauge().GetValue() + s.GetCounter().GetValue() + float64(s.GetHistogram().GetSampleCount()); v != 0 {
				t.Errorf("%s starts at %v, want 0", mf.GetName(), v)
			}
		}
	}
	for name, per := range want {
		if got[name] != 2*per {
			t.Errorf("%s: %d series, want %d (2 lanes × %d)", name, got[name], 2*per, per)
		}
	}
	if len(got) != len(want) {
		t.Errorf("registry has %d lane metrics, want %d", len(got), len(want))
	}
	for name := range process {
		t.Errorf("%s missing from the start", name)
	}
}

// TestPacingBucketsResolveOnePercent: the pacing histograms resolve 1 % of
// the lane's interval where it matters (lateness up to 10 %, gaps from 0.9
// to 1.05 intervals), at 1/s, 100/s and 10,000/s; and a removed lane's
// histograms leave the registry (C31).
func TestPacingBucketsResolveOnePercent(t *testing.T) {
	for _, limit := range []float64{1, 100, 10000} {
		iv := 1 / limit
		check := func(name string, b []float64, from, to float64) {
			for i := 1; i < len(b); i++ {
				if b[i] <= b[i-1] {
					t.Fatalf("%s at %v/s: buckets not increasing: %v", name, limit, b)
				}
				if b[i-1] >= from*iv && b[i] <= to*iv*1.0001 && b[i]-b[i-1] > 0.0101*iv {
					t.Errorf("%s at %v/s: bucket %v..%v wider than 1 %% of %v", name, limit, b[i-1], b[i], iv)
				}
			}
		}
		check("lateness", LatenessBuckets(limit), 0, 0.1)
		check("gap", GapBuckets(limit), 0.9, 1.05)
	}
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Lane("a", 100).Lateness.Observe(0.001)
	m.Lane("a", 100) // again: no duplicate registration (C31)
	m.Remove("a")
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if len(mf.GetMetric()) > 0 && !strings.HasPrefix(mf.GetName(), "shaper_config_") {
			t.Errorf("%s still has series after Remove", mf.GetName())
		}
	}
	m.Lane("a", 50) // a lane added back
}

func TestMetricsLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg).Lane("payments", 100)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// TestQueueWaitBucketsResolveWaits: issue 12 — a wait of 14 s (a p99 near
// capacity / limit) lies in a bucket whose bounds are at most 25 % apart,
// and so does every wait from 0.1 s to 800 s; the buckets rise and end at
// one hour or more.
func TestQueueWaitBucketsResolveWaits(t *testing.T) {
	b := QueueWaitBuckets()
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			t.Fatalf("buckets not increasing at %d: %v", i, b)
		}
	}
	if b[len(b)-1] < 3600 {
		t.Errorf("last bucket %v s, want at least an hour", b[len(b)-1])
	}
	bracket := func(v float64) (lo, hi float64) {
		for i := 1; i < len(b); i++ {
			if v > b[i-1] && v <= b[i] {
				return b[i-1], b[i]
			}
		}
		return 0, 0
	}
	if lo, hi := bracket(14); hi/lo > 1.25 || lo == 0 {
		t.Errorf("14 s lies in (%v, %v]: bounds %.0f %% apart, want ≤ 25 %%", lo, hi, 100*(hi/lo-1))
	}
	for v := 0.101; v < 800; v *= 1.03 {
		if lo, hi := bracket(v); lo == 0 || hi/lo > 1.2501 {
			t.Errorf("%.3g s lies in (%v, %v], want bounds ≤ 25 %% apart", v, lo, hi)
		}
	}
	// The series registered by New uses them.
	reg := prometheus.NewRegistry()
	New(reg).Lane("a", 100).QueueWait.Observe(14)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "shaper_queue_wait_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if got := len(h.GetBucket()); got != len(b) {
			t.Errorf("shaper_queue_wait_seconds has %d buckets, want QueueWaitBuckets' %d", got, len(b))
		}
		for _, bk := range h.GetBucket() {
			if bk.GetCumulativeCount() == 1 && bk.GetUpperBound() > 14*1.25 {
				t.Errorf("the first bucket counting 14 s ends at %v", bk.GetUpperBound())
			}
			if bk.GetCumulativeCount() == 1 {
				break
			}
		}
	}
}
