package sources

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestEnsureStreamLimits: issue 12 — a stream shaper creates gets the
// configured retention and limits; an existing stream with other settings
// is left as it is and a warning says so; one with the same settings gets
// no warning.
func TestEnsureStreamLimits(t *testing.T) {
	js := testJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	want := &StreamLimits{Retention: jetstream.LimitsPolicy, MaxAge: 7 * 24 * time.Hour, MaxBytes: 1 << 20,
		Discard: jetstream.DiscardNew}
	info := func(name string) jetstream.StreamConfig {
		t.Helper()
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config
	}

	// Created by shaper: the limits apply.
	if err := EnsureStreamLimits(ctx, js, "CREATED", []string{"created.>"}, want, log); err != nil {
		t.Fatal(err)
	}
	got := info("CREATED")
	if got.Retention != want.Retention || got.MaxAge != want.MaxAge || got.MaxBytes != want.MaxBytes || got.Discard != want.Discard {
		t.Errorf("created stream: retention %v, max_age %v, max_bytes %d, discard %v; want %+v",
			got.Retention, got.MaxAge, got.MaxBytes, got.Discard, *want)
	}
	// Again, the same settings: no warning.
	if err := EnsureStreamLimits(ctx, js, "CREATED", []string{"created.>"}, want, log); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "differs") {
		t.Errorf("a warning for a stream with the configured limits:\n%s", logs.String())
	}

	// Created by someone else, with other settings: left alone, a warning.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EXISTING", Subjects: []string{"existing.>"},
		Retention: jetstream.InterestPolicy, MaxAge: time.Hour, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if err := EnsureStreamLimits(ctx, js, "EXISTING", []string{"existing.>"}, want, log); err != nil {
		t.Fatal(err)
	}
	got = info("EXISTING")
	if got.Retention != jetstream.InterestPolicy || got.MaxAge != time.Hour || got.MaxBytes != -1 {
		t.Errorf("existing stream changed: retention %v, max_age %v, max_bytes %d", got.Retention, got.MaxAge, got.MaxBytes)
	}
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "stream retention differs from the configuration") && strings.Contains(l, "stream=EXISTING") {
			line = l
		}
	}
	if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "retention=Interest") ||
		!strings.Contains(line, "want_retention=Limits") || !strings.Contains(line, "want_max_age=168h0m0s") {
		t.Errorf("no warning naming the stream's and the configured retention:\n%s", logs.String())
	}

	// An existing stream that does not capture the lane's subjects is
	// extended with them, and a warning names what was added (a new-user
	// pass found the change silent).
	logs.Reset()
	if err := EnsureStreamLimits(ctx, js, "EXISTING", []string{"existing.>", "more.jobs"}, want, log); err != nil {
		t.Fatal(err)
	}
	if got := info("EXISTING").Subjects; strings.Join(got, ",") != "existing.>,more.jobs" {
		t.Errorf("existing stream's subjects %v, want [existing.> more.jobs]", got)
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "existing stream extended") ||
		!strings.Contains(l, "added=[more.jobs]") || !strings.Contains(l, "subjects_before=[existing.>]") {
		t.Errorf("no warning naming the subjects added to the stream:\n%s", l)
	}

	// source.replicas 3 against an existing R1 stream (issue 13): the stream
	// keeps its replicas, with a warning naming both.
	r3 := *want
	r3.Replicas = 3
	logs.Reset()
	if err := EnsureStreamLimits(ctx, js, "CREATED", []string{"created.>"}, &r3, log); err != nil {
		t.Fatal(err)
	}
	if got := info("CREATED"); got.Replicas != 1 {
		t.Errorf("existing stream's replicas changed to %d", got.Replicas)
	}
	if !strings.Contains(logs.String(), "stream replicas differ from source.replicas") ||
		!strings.Contains(logs.String(), "replicas=1 want_replicas=3") {
		t.Errorf("no warning naming the stream's and the configured replicas:\n%s", logs.String())
	}
	logs.Reset()
	if err := EnsureStreamLimits(ctx, js, "CREATED", []string{"created.>"}, want, log); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "replicas differ") {
		t.Errorf("a replicas warning for a stream with the configured replicas:\n%s", logs.String())
	}
}
