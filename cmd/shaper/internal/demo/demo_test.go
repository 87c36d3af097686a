package demo

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBusySpan: the busy span ends at the last accepted request that left
// while another published message was still waiting.
func TestBusySpan(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Three published at 0; a fourth at 500, after the backlog emptied.
	published := []time.Time{at(0), at(0), at(0), at(500)}
	events := []rigidEvent{
		{at: at(10), accepted: true}, {at: at(20), accepted: true}, {at: at(15), accepted: false},
		{at: at(30), accepted: true}, {at: at(510), accepted: true},
	}
	n, d := busySpan(published, events)
	if n != 3 || d != 20*time.Millisecond {
		t.Fatalf("busySpan = %d, %v; want 3, 20ms (the first three accepted, 10 ms to 30 ms)", n, d)
	}
	if n, d := busySpan(published[:1], events[:1]); n != 1 || d != 0 {
		t.Fatalf("one request: busySpan = %d, %v; want 1, 0", n, d)
	}
}

// TestRigidGap: the rigid downstream's gap leaves the 10 % margin of SPEC §5.
func TestRigidGap(t *testing.T) {
	if g := RigidGap(100); g != 9090909*time.Nanosecond {
		t.Fatalf("RigidGap(100) = %v, want 9.090909ms", g)
	}
}
