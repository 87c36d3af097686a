package sourcetest_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shaper-dev/shaper/sources/sourcetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMemConformance: the in-memory source keeps the contract every source
// keeps.
func TestMemConformance(t *testing.T) {
	sourcetest.Run(t, func(t *testing.T, ackWait time.Duration) sourcetest.Fixture {
		mem := sourcetest.NewMem(ackWait)
		t.Cleanup(mem.Close)
		return sourcetest.Fixture{Source: mem, Publish: func(_ testing.TB, n int) { mem.Publish(n) }}
	})
}
