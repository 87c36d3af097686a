package simulate

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/shaper/shapertest"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// quotaLane is issue 16's quota proof lane: 50/s, quota {count: 300, per:
// 10s}, a bucket of 500.
func quotaLane() config.Lane {
	cfg := lane(50, 500, config.OverflowBlock)
	cfg.Rate.Quota = config.Quota{Count: 300, Per: 10 * time.Second}
	return cfg
}

// windowCounts returns the departures in each fixed window [k·per,
// (k+1)·per) from offset 0.
func windowCounts(ds []Departure, per time.Duration) []int {
	var out []int
	for _, d := range ds {
		k := int(d.At / per)
		for len(out) <= k {
			out = append(out, 0)
		}
		out[k]++
	}
	return out
}

// TestRunQuota: SPEC §3 Quota on the virtual clock — `quota: {count: 300,
// per: 10s}` at 50/s under a backlog of 1,500: no 10 s window holds more
// than 300, each 10 s window holds 300 (the quota used in full), the lane
// waits four times (from 6 s to 10.002 s, and so on), every gap is at
// least the interval (no burst after a wait, G2), and the summary says so.
func TestRunQuota(t *testing.T) {
	res := Run(quotaLane(), Burst(1500, 0, 0), Options{})
	if len(res.Departures) != 1500 {
		t.Fatalf("%d departures, want 1500", len(res.Departures))
	}
	ts := make([]time.Time, len(res.Departures))
	for i, d := range res.Departures {
		ts[i] = Epoch.Add(d.At)
	}
	if n, _ := shapertest.MaxInWindow(ts, 10*time.Second); n != 300 {
		t.Errorf("%d departures in a 10 s window, want 300", n)
	}
	for k, n := range windowCounts(res.Departures, 10*time.Second)[:5] {
		if n != 300 {
			t.Errorf("window %d (%ds–%ds) holds %d, want 300 (the quota in full)", k, 10*k, 10*k+10, n)
		}
	}
	for i := 1; i < len(ts); i++ {
		if g := ts[i].Sub(ts[i-1]); g < 20*time.Millisecond {
			t.Fatalf("gap %d = %v at %v, under the interval: the wait was made up (a burst)", i, g, res.Departures[i].At)
		}
	}
	if len(res.QuotaWaits) != 4 {
		t.Fatalf("quota waits %v, want 4", res.QuotaWaits)
	}
	if w := res.QuotaWaits[0]; w.From != 5980*time.Millisecond || w.Until != 10*time.Second+shaper.QuotaMargin {
		t.Errorf("first quota wait %v–%v, want 5.98s (after departure 300) to 10.002s (the first leaves the window)", w.From, w.Until)
	}
	s := res.Summarize()
	if s.WorstQuotaWindow != 300 || s.QuotaWait < 4*4*time.Second {
		t.Errorf("summary: worst quota window %d, quota wait %v; want 300 and over 16 s", s.WorstQuotaWindow, s.QuotaWait)
	}
	var out bytes.Buffer
	res.WriteSummary(&out)
	if !strings.Contains(out.String(), "quota 300 per 10s: 4 waits") || !strings.Contains(out.String(), "worst 10s window: 300 departures") {
		t.Errorf("summary does not show the quota:\n%s", out.String())
	}
}

// TestRunQuotaMatchesDaemon: the simulated quota is the daemon's — the
// daemon's own drain.Lane, run on synctest's fake clock with the same
// configuration and backlog, departs at the same instants as Run, to the
// nanosecond, through two quota waits.
func TestRunQuotaMatchesDaemon(t *testing.T) {
	cfg := quotaLane()
	cfg.Rate.Quota = config.Quota{Count: 100, Per: 5 * time.Second}
	const n = 350
	sim := Run(cfg, Burst(n, 0, 0), Options{})
	synctest.Test(t, func(t *testing.T) {
		dcfg := cfg
		dcfg.Source = config.Source{Stream: "MEM", Subjects: []string{"jobs"}, Consumer: "sim", AckWait: time.Minute, MaxDeliver: 5}
		dcfg.Task = config.Task{Timeout: 5 * time.Second, MaxInFlight: 8,
			Retry: config.Retry{Backoff: []time.Duration{time.Second}, RetryAfter: true, MaxDelay: time.Minute}}
		dcfg.DeadLetter = config.DeadLetter{Subject: "shaper.dead.sim"}
		dcfg.Sink = config.Sink{Kind: config.SinkLog}
		src := sourcetest.NewMem(time.Minute)
		src.Publish(n)
		sink := &departed{}
		l, err := drain.New("sim", dcfg, src, sink, drain.WithWaiter(drain.TimerWaiter{}))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		l.Start()
		time.Sleep(20 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		l.Drain(ctx)
		cancel()
		src.Close()
		got := sink.offsets(start)
		if len(got) != n {
			t.Fatalf("the daemon departed %d, want %d", len(got), n)
		}
		first := got[0] // the daemon's first fetch lands a moment after start
		for i, d := range sim.Departures {
			if got[i]-first != d.At {
				t.Fatalf("departure %d: daemon at %v, simulate at %v (after the first)", i, got[i]-first, d.At)
			}
		}
	})
}

// departed records when each message departed.
type departed struct {
	mu sync.Mutex
	at []time.Time
}

func (s *departed) Send(_ context.Context, m *shaper.Message) error {
	s.mu.Lock()
	s.at = append(s.at, m.Departed)
	s.mu.Unlock()
	return nil
}

func (s *departed) offsets(start time.Time) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]time.Duration, len(s.at))
	for i, t := range s.at {
		out[i] = t.Sub(start)
	}
	return out
}
