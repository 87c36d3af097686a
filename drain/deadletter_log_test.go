package drain

import (
	"bytes"
	"errors"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// lockedBuffer is a bytes.Buffer safe for the lane's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestDeadLetterLogIsRateLimited: issue 12 — a downstream that answers 400
// to everything dead-letters at the lane's rate (here 50/s for 25 s of fake
// time, 1,250 messages); the logs get the first dead letter on its own line
// and then one summary per 10 s with the count per reason, the last one at
// the end of the drain, and the counts add up to every dead letter.
func TestDeadLetterLogIsRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 1250
		sink := &recSink{behave: func(call) (time.Duration, error) {
			return 0, &shaper.SinkError{Status: 400, Permanent: true, Err: errors.New("bad request")}
		}}
		cfg := laneConfig(50)
		cfg.Bucket.Capacity = 2000
		h := newHarness(t, cfg, sink)
		logs := &lockedBuffer{}
		h.lane.log = slog.New(slog.NewTextHandler(logs, nil))
		h.src.Publish(n)
		h.lane.Start()
		time.Sleep(n/50*time.Second + time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if got := len(h.dead.snapshot()); got != n {
			t.Fatalf("%d dead letters, want %d", got, n)
		}
		var single, summaries, counted int
		count := regexp.MustCompile(`by_reason\.rejected_by_sink=(\d+)`)
		for _, line := range strings.Split(logs.String(), "\n") {
			switch {
			case strings.Contains(line, `msg="dead-lettered since the last line"`):
				summaries++
				m := count.FindStringSubmatch(line)
				if m == nil {
					t.Fatalf("summary without the count of its reason: %s", line)
				}
				c, _ := strconv.Atoi(m[1])
				counted += c
			case strings.Contains(line, `msg=dead-lettered`):
				single++
			}
		}
		// 25 s of dead letters: one line at 0 s, summaries at 10 s, 20 s
		// and at the drain.
		if single != 1 || summaries < 2 || summaries > 4 {
			t.Errorf("%d single lines and %d summaries for %d dead letters over 25 s, want 1 and 2..4:\n%s",
				single, summaries, n, logs.String())
		}
		if single+counted != n {
			t.Errorf("lines account for %d single + %d summarised dead letters, want %d", single, counted, n)
		}
	})
}
