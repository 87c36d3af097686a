package drain

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
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

// packedSink reads headers through the accessors (drain.PackedHeaderReader).
type packedSink struct {
	mu      sync.Mutex
	header  []map[string][]string // HeaderMap of each call
	rawNil  []bool                // whether m.Header was nil (left packed)
	readsIt bool
}

func (s *packedSink) ReadsPackedHeaders() bool { return s.readsIt }

func (s *packedSink) Send(_ context.Context, m *shaper.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.header = append(s.header, m.HeaderMap())
	s.rawNil = append(s.rawNil, m.Header == nil)
	return nil
}

// TestLaneLeavesHeadersPackedForReaders (issue 15, CPU per message): a sink
// that reads headers through the accessors gets them packed (no map built
// per departure); one that says it does not (false), or does not say, gets
// m.Header set (TestLanePackedHeaders).
func TestLaneLeavesHeadersPackedForReaders(t *testing.T) {
	for _, reads := range []bool{true, false} {
		t.Run(fmt.Sprintf("reads packed %v", reads), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sink := &packedSink{readsIt: reads}
				src := sourcetest.NewMem(time.Minute)
				l, err := New("test", laneConfig(10), src, sink, WithWaiter(TimerWaiter{}))
				if err != nil {
					t.Fatal(err)
				}
				src.PublishHeaders(map[string][]string{"X-Orig": {"a", "b"}})
				l.Start()
				time.Sleep(time.Second)
				synctest.Wait()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				l.Drain(ctx)
				cancel()
				src.Close()
				if len(sink.header) != 1 {
					t.Fatalf("%d calls, want 1", len(sink.header))
				}
				if got := sink.header[0]["X-Orig"]; !slices.Equal(got, []string{"a", "b"}) {
					t.Errorf("X-Orig %q, want [a b]", got)
				}
				if sink.rawNil[0] != reads {
					t.Errorf("m.Header nil: %v, want %v (packed only for a PackedHeaderReader)", sink.rawNil[0], reads)
				}
			})
		})
	}
}
