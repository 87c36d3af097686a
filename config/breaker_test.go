package config_test

import (
	"testing"
	"time"
)

// TestBreakerKeys: task.breaker (SPEC §3 Breaker, §4) — the defaults, an
// explicit section, an environment override, and each rule's problem under
// its key path.
func TestBreakerKeys(t *testing.T) {
	c, _ := mustLoad(t, laneYAML(""))
	b := c.Downstreams["payments"].Task.Breaker
	if b.FailureRatio != 0 || b.MinAttempts != 20 || b.Window != 30*time.Second || b.ProbeEvery != 10*time.Second {
		t.Errorf("defaults %+v, want ratio 0 (off), 20 attempts, 30s, 10s", b)
	}
	c, _ = mustLoad(t, laneYAML("", "task: {breaker: {failure_ratio: 0.5, min_attempts: 5, window: 1m, probe_every: 2s}}"))
	if b := c.Downstreams["payments"].Task.Breaker; b.FailureRatio != 0.5 || b.MinAttempts != 5 || b.Window != time.Minute || b.ProbeEvery != 2*time.Second {
		t.Errorf("explicit %+v", b)
	}
	c, _ = mustLoad(t, laneYAML("", "task: {breaker: {window: 1m}}"))
	if b := c.Downstreams["payments"].Task.Breaker; b.MinAttempts != 20 || b.Window != time.Minute {
		t.Errorf("one key given, the others default: %+v", b)
	}
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_TASK_BREAKER_FAILURE_RATIO", "0.25")
	c, _ = mustLoad(t, laneYAML(""))
	if r := c.Downstreams["payments"].Task.Breaker.FailureRatio; r != 0.25 {
		t.Errorf("environment override: failure_ratio %v, want 0.25", r)
	}
}

func TestBreakerInvalid(t *testing.T) {
	runBroken(t, []brokenCase{
		{name: "ratio above 1", text: laneYAML("", "task: {breaker: {failure_ratio: 1.5}}"),
			key: lanePfx + "task.breaker.failure_ratio", want: []string{"[0, 1]", "1.5"}},
		{name: "ratio negative", text: laneYAML("", "task: {breaker: {failure_ratio: -0.1}}"),
			key: lanePfx + "task.breaker.failure_ratio", want: []string{"[0, 1]", "-0.1"}},
		{name: "min_attempts 0", text: laneYAML("", "task: {breaker: {min_attempts: 0}}"),
			key: lanePfx + "task.breaker.min_attempts", want: []string{"≥ 1", "got 0"}},
		{name: "window 0s", text: laneYAML("", "task: {breaker: {window: 0s}}"),
			key: lanePfx + "task.breaker.window", want: []string{"> 0", "0s"}},
		{name: "probe_every 0s", text: laneYAML("", "task: {breaker: {probe_every: 0s}}"),
			key: lanePfx + "task.breaker.probe_every", want: []string{"> 0", "0s"}},
		{name: "probe_every bare number", text: laneYAML("", "task: {breaker: {probe_every: 10}}"),
			key: lanePfx + "task.breaker.probe_every", want: []string{`"10"`, "unit"}},
		{name: "typo", text: laneYAML("", "task: {breaker: {min_attempt: 3}}"),
			key: lanePfx + "task.breaker.min_attempt", want: []string{"unknown key"}},
	})
}
