package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSeriesExistFromStart: SPEC §6 — every series of every configured lane
// and every listed label value exists from start with value 0.
func TestSeriesExistFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Lane("payments")
	m.Lane("refunds")
	want := map[string]int{ // series per lane
		"shaper_bucket_depth_messages": 1, "shaper_bucket_capacity_messages": 1, "shaper_rate_limit_per_second": 1,
		"shaper_in_flight_tasks": 1, "shaper_admitted_messages_total": 1, "shaper_departures_total": 1,
		"shaper_deliveries_total": len(DeliveryOutcomes), "shaper_dead_letters_total": len(DeadLetterReasons),
		"shaper_queue_wait_seconds": 1, "shaper_task_duration_seconds": len(TaskOutcomes),
		"shaper_lane_paused": 1, "shaper_global_limiter_fallback": 1,
		"shaper_retries_total": len(RetryReasons), "shaper_redelivered_messages_total": 1,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
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
		t.Errorf("registry has %d metrics, want %d", len(got), len(want))
	}
}

func TestMetricsLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg).Lane("payments")
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
