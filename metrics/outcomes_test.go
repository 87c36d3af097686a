package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSpecLabelValuesFromStart: the label values SPEC §6 names exist from
// start at 0 — shaper_deliveries_total{outcome="duplicate_skipped"} (SPEC §3
// Delivered-key dedup) and shaper_retries_total{reason="not_before"} (the
// holds of a Shaper-Not-Before) among them — so that a dashboard of dedup
// or of holds never sees a missing series.
func TestSpecLabelValuesFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg).Lane("payments", 100)
	want := `
# HELP shaper_deliveries_total Finished tasks by what they led to: success (acked), retry (nak'd), dead_letter, duplicate_skipped (acked without a sink call: key already delivered, sink.dedup_window).
# TYPE shaper_deliveries_total counter
shaper_deliveries_total{lane="payments",outcome="dead_letter"} 0
shaper_deliveries_total{lane="payments",outcome="duplicate_skipped"} 0
shaper_deliveries_total{lane="payments",outcome="retry"} 0
shaper_deliveries_total{lane="payments",outcome="success"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "shaper_deliveries_total"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "shaper_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == "not_before" {
					found = true
				}
			}
		}
	}
	if !found {
		t.Error(`shaper_retries_total{reason="not_before"} missing from the start`)
	}
}
