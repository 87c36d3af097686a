package sources

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestControlReplicasWarning: an existing SHAPER_CONTROL bucket keeps its
// replicas; when they differ from the largest source.replicas, OpenControl
// logs one warning at Warn level with both numbers, and none when they are
// the same (issue 13; a single server, so the bucket is R1 and the config
// asks for R3).
func TestControlReplicasWarning(t *testing.T) {
	js := testJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := OpenControl(ctx, js, 1, WithControlLogger(log)); err != nil { // creates it, R1
		t.Fatal(err)
	}
	if _, err := OpenControl(ctx, js, 1, WithControlLogger(log)); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("a log line for a bucket with the configured replicas:\n%s", logs.String())
	}
	if _, err := OpenControl(ctx, js, 3, WithControlLogger(log)); err != nil {
		t.Fatalf("an existing R1 bucket with source.replicas 3: %v (it must open, keeping its replicas)", err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") ||
		!strings.Contains(lines[0], "bucket=SHAPER_CONTROL") ||
		!strings.Contains(lines[0], "replicas=1") || !strings.Contains(lines[0], "want_replicas=3") {
		t.Errorf("want one WARN line naming the bucket, replicas=1 and want_replicas=3; got:\n%s", logs.String())
	}
}
