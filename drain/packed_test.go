package drain

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// TestLanePackedHeaders (issue 15): sourcetest.Mem delivers headers packed,
// as the JetStream source does. A message dead-lettered before it departs
// (invalid at admission) keeps its original headers in the dead letter
// (SPEC §3 Dead letter), and the sink gets a departed message's headers in
// m.Header.
func TestLanePackedHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		h := newHarness(t, laneConfig(10), sink)
		h.src.PublishHeaders(
			map[string][]string{shaper.NotBeforeHeader: {"next tuesday"}, "X-Orig": {"a", "b"}},
			map[string][]string{"X-Orig": {"c"}},
		)
		h.lane.Start()
		time.Sleep(time.Second)
		synctest.Wait()
		h.stop(time.Second)
		dead := h.dead.snapshot()
		if len(dead) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dead))
		}
		if got := dead[0].header["X-Orig"]; len(got) != 2 || got[0] != "a" || got[1] != "b" {
			t.Errorf("dead letter's X-Orig %q, want the original [a b]", got)
		}
		if got := dead[0].header[shaper.NotBeforeHeader]; len(got) != 1 || got[0] != "next tuesday" {
			t.Errorf("dead letter's %s %q, want the original", shaper.NotBeforeHeader, got)
		}
		cs := sink.snapshot()
		if len(cs) != 1 || len(cs[0].header["X-Orig"]) != 1 || cs[0].header["X-Orig"][0] != "c" {
			t.Errorf("sink calls %v, want msg-1 with X-Orig [c] in m.Header", cs)
		}
	})
}
