package config_test

import (
	"strings"
	"testing"
	"time"
)

// TestLoad_DedupWindow: sink.dedup_window (SPEC §4) defaults to 0 (off),
// takes a Go duration, must be ≥ 0, and is warned about when shorter than
// twice source.ack_wait.
func TestLoad_DedupWindow(t *testing.T) {
	c, warns := mustLoad(t, laneYAML(""))
	if w := c.Downstreams["payments"].Sink.DedupWindow; w != 0 {
		t.Errorf("default sink.dedup_window %v, want 0", w)
	}
	for _, w := range warns {
		if strings.Contains(w.String(), "dedup_window") {
			t.Errorf("warning with dedup off: %s", w)
		}
	}
	c, warns = mustLoad(t, laneYAML("", "sink: {kind: log, dedup_window: 10m}"))
	if w := c.Downstreams["payments"].Sink.DedupWindow; w != 10*time.Minute {
		t.Errorf("sink.dedup_window %v, want 10m", w)
	}
	for _, w := range warns {
		if strings.Contains(w.String(), "dedup_window") {
			t.Errorf("warning for 10m with ack_wait 60s: %s", w)
		}
	}
	_, warns = mustLoad(t, laneYAML("", "source: {stream: S, subjects: [a.>], ack_wait: 60s}", "sink: {kind: log, dedup_window: 90s}"))
	requireWarning(t, warns, lanePfx+"sink.dedup_window", "1m30s", "twice source.ack_wait 1m0s")
	runBroken(t, []brokenCase{
		{name: "negative", text: laneYAML("", "sink: {kind: log, dedup_window: -1m}"),
			key: lanePfx + "sink.dedup_window", want: []string{"≥ 0", "-1m0s"}},
		{name: "no unit", text: laneYAML("", "sink: {kind: log, dedup_window: 600}"),
			key: lanePfx + "sink.dedup_window", want: []string{"unit"}},
		{name: "env negative", text: laneYAML(""), env: map[string]string{"SHAPER_DOWNSTREAMS_PAYMENTS_SINK_DEDUP_WINDOW": "-5s"},
			key: lanePfx + "sink.dedup_window", want: []string{"-5s"}},
	})
}
