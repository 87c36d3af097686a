package config_test

import (
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
)

// TestLoad_AckWaitBelowTimeout: a task.timeout longer than source.ack_wait
// is valid (SPEC G7, issue 13: a running task keeps its message with
// in-progress acks, so a sink call may outlive ack_wait); it is warned
// about, as every ack_wait shorter than the worst-case hold is.
func TestLoad_AckWaitBelowTimeout(t *testing.T) {
	for _, tc := range []struct{ ackWait, timeout string }{{"5s", "5s"}, {"2s", "10s"}, {"4s", "15s"}} {
		c, warns := mustLoad(t, laneYAML("", "source: {stream: S, subjects: [a.>], ack_wait: "+tc.ackWait+"}",
			"task: {timeout: "+tc.timeout+"}"))
		l := c.Downstreams["payments"]
		if want, _ := time.ParseDuration(tc.timeout); l.Task.Timeout != want {
			t.Errorf("task.timeout %v, want %s", l.Task.Timeout, tc.timeout)
		}
		requireWarning(t, warns, lanePfx+"source.ack_wait", "task.timeout "+tc.timeout, "in-progress acks")
	}
}

// TestLoad_AckWaitMinimum: source.ack_wait is at least config.MinAckWait
// (1s). In-progress acks go every ack_wait / 4 and must reach the server
// before it runs out (SPEC G7); a new-user pass set 1ms, validate only
// warned, and the downstream got two messages twice.
func TestLoad_AckWaitMinimum(t *testing.T) {
	for _, bad := range []string{"1ms", "999ms", "0s", "-1s"} {
		err := loadErr(t, laneYAML("", "source: {stream: S, subjects: [a.>], ack_wait: "+bad+"}"))
		requireProblem(t, err, lanePfx+"source.ack_wait", "must be at least 1s", "got "+bad)
	}
	c, _ := mustLoad(t, laneYAML("", "source: {stream: S, subjects: [a.>], ack_wait: 1s}"))
	if got := c.Downstreams["payments"].Source.AckWait; got != config.MinAckWait {
		t.Errorf("ack_wait 1s loaded as %v", got)
	}
}
