package sources

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestEmbeddedStoreLocked: a second embedded server on a store directory
// that one already uses is refused with a message that names the directory
// and the process holding it, and starts nothing; once the first has shut
// down, the directory can be used again (a restart). Two servers on one
// store rewrite each other's files: a new-user pass lost messages that
// JetStream had acknowledged, and an operator's pause, that way.
func TestEmbeddedStoreLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	first, err := StartEmbedded("127.0.0.1:0", dir)
	if err != nil {
		t.Fatal(err)
	}
	second, err := StartEmbedded("127.0.0.1:0", dir)
	if err == nil {
		second.Shutdown()
		first.Shutdown()
		t.Fatal("a second embedded server started on the same store_dir")
	}
	pid := strconv.Itoa(os.Getpid())
	for _, want := range []string{dir, "in use by process " + pid, "own store_dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	first.Shutdown()
	first.WaitForShutdown()
	again, err := StartEmbedded("127.0.0.1:0", dir)
	if err != nil {
		t.Fatalf("after the first shut down: %v", err)
	}
	again.Shutdown()
	again.WaitForShutdown()
}
