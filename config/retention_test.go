package config_test

import (
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
)

// TestLoad_Retention: issue 12 — the retention keys default to limits with
// max_age 7 days (source) and 30 days (dead letters), and bad values are
// reported with their key paths.
func TestLoad_Retention(t *testing.T) {
	c, _ := mustLoad(t, laneYAML(""))
	r := c.Downstreams["payments"].Source.Retention
	if r.Kind != config.RetentionLimits || r.MaxAge != 7*24*time.Hour || r.MaxBytes != 0 {
		t.Errorf("source.retention defaults %+v", r)
	}
	if d := c.DeadLetterStream; d.MaxAge != 30*24*time.Hour || d.MaxBytes != 0 {
		t.Errorf("dead_letter_stream defaults %+v", d)
	}
	c, warns := mustLoad(t, laneYAML("dead_letter_stream: {max_age: 0s, max_bytes: 1073741824}",
		"source: {stream: S, subjects: [a.>], retention: {kind: work_queue, max_age: 1h, max_bytes: 1000000}}",
		"bucket: {max_age: 2h}"))
	if r := c.Downstreams["payments"].Source.Retention; r.Kind != config.RetentionWorkQueue || r.MaxAge != time.Hour || r.MaxBytes != 1000000 {
		t.Errorf("source.retention %+v", r)
	}
	if c.DeadLetterStream.MaxAge != 0 || c.DeadLetterStream.MaxBytes != 1<<30 {
		t.Errorf("dead_letter_stream %+v", c.DeadLetterStream)
	}
	requireWarning(t, warns, lanePfx+"source.retention.max_age", "bucket.max_age")
	runBroken(t, []brokenCase{
		{name: "unknown kind", text: laneYAML("", "source: {stream: S, subjects: [a.>], retention: {kind: forever}}"),
			key: lanePfx + "source.retention.kind", want: []string{`"forever"`, "limits, work_queue or interest"}},
		{name: "negative max_age", text: laneYAML("", "source: {stream: S, subjects: [a.>], retention: {max_age: -1s}}"),
			key: lanePfx + "source.retention.max_age", want: []string{"≥ 0"}},
		{name: "negative max_bytes", text: laneYAML("", "source: {stream: S, subjects: [a.>], retention: {max_bytes: -5}}"),
			key: lanePfx + "source.retention.max_bytes", want: []string{"-5"}},
		{name: "retention max_age without unit", text: laneYAML("", "source: {stream: S, subjects: [a.>], retention: {max_age: 7}}"),
			key: lanePfx + "source.retention.max_age", want: []string{"unit"}},
		{name: "dead letter max_age negative", text: laneYAML("dead_letter_stream: {max_age: -1h}"),
			key: "dead_letter_stream.max_age", want: []string{"≥ 0"}},
		{name: "dead letter unknown key", text: laneYAML("dead_letter_stream: {max_count: 5}"),
			key: "dead_letter_stream.max_count", want: []string{"unknown"}},
		{name: "env retention kind", text: laneYAML(""), env: map[string]string{"SHAPER_DOWNSTREAMS_PAYMENTS_SOURCE_RETENTION_KIND": "all"},
			key: lanePfx + "source.retention.kind", want: []string{`"all"`}},
	})
}
