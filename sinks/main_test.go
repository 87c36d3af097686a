package sinks_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// sink, httptest.Server, NATS connection and in-process NATS server the
// tests start is stopped by a t.Cleanup.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
