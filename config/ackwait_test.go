package config_test

import (
	"testing"
	"time"
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
