package simulate

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests (the daemon's lane of
// TestRunQuotaMatchesDaemon starts some).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
