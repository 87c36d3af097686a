package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestJSONLogDurations: the JSON log writes a duration as the text log and
// the config do ("500ms"), not as nanoseconds (a new-user pass read
// "retry_in":500000000).
func TestJSONLogDurations(t *testing.T) {
	var b bytes.Buffer
	newLogger(&b, "info", "json").Info("attempt failed", "retry_in", 500*time.Millisecond, "n", 3)
	if out := b.String(); !strings.Contains(out, `"retry_in":"500ms"`) || !strings.Contains(out, `"n":3`) {
		t.Errorf("JSON log line %q, want \"retry_in\":\"500ms\" and the other values as they were", out)
	}
}
