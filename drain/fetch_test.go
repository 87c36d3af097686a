package drain

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// leaderless is a source whose pulls fail until up, as a cluster's do while
// it elects a consumer leader; soon says whether the failure is one that
// no server answered (RetrySoon, sources.JetStream's "no responders").
type leaderless struct {
	*sourcetest.Mem
	up    time.Time
	soon  bool
	mu    sync.Mutex
	tries []time.Time // the failed pulls
}

type soonErr struct{}

func (soonErr) Error() string   { return "no responders" }
func (soonErr) RetrySoon() bool { return true }

func (s *leaderless) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	if now := time.Now(); now.Before(s.up) {
		s.mu.Lock()
		s.tries = append(s.tries, now)
		s.mu.Unlock()
		if s.soon {
			return soonErr{}
		}
		return errors.New("pull failed")
	}
	return s.Mem.Fetch(ctx, max, deliver)
}

// TestFetchRetriesSoonWithoutLeader: pulls that no server answers (an
// election) are tried again within noLeaderRetry, so the lane resumes
// within a quarter of a second of the new leader; other failures back off
// to 1 s. Either way one warning, not one per try, and one line when the
// pulls work again.
func TestFetchRetriesSoonWithoutLeader(t *testing.T) {
	for _, soon := range []bool{true, false} {
		name := map[bool]string{true: "no leader", false: "other failure"}[soon]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := laneConfig(100)
				start := time.Now()
				src := &leaderless{Mem: sourcetest.NewMem(cfg.Source.AckWait), up: start.Add(5 * time.Second), soon: soon}
				logs := &logRecorder{}
				sink := &recSink{}
				reg := prometheus.NewRegistry()
				l, err := New("test", cfg, src, sink, WithWaiter(TimerWaiter{}), WithMetrics(metrics.New(reg).Lane("test", 100)),
					WithDeadLetter(&recSink{}), WithLogger(slog.New(logs)))
				if err != nil {
					t.Fatal(err)
				}
				src.Publish(3)
				l.Start()
				time.Sleep(7 * time.Second)
				synctest.Wait()
				cs := sink.snapshot()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				l.Drain(ctx)
				cancel()
				src.Close()
				if len(cs) != 3 {
					t.Fatalf("%d delivered, want 3", len(cs))
				}
				resumed := cs[0].at.Sub(src.up)
				src.mu.Lock()
				tries := len(src.tries)
				_, longest := gaps(src.tries)
				src.mu.Unlock()
				want := time.Second
				if soon {
					want = noLeaderRetry
				}
				if resumed > want {
					t.Errorf("first delivery %v after the pulls work again, want ≤ %v", resumed, want)
				}
				if longest != want {
					t.Errorf("failed pulls up to %v apart, want the back-off capped at %v", longest, want)
				}
				if w := logs.count(slog.LevelWarn, "fetch failed"); w != 1 {
					t.Errorf("%d warnings \"fetch failed\" for %d failed pulls in 5 s, want 1", w, tries)
				}
				if n := logs.count(slog.LevelInfo, "fetch resumed"); n != 1 {
					t.Errorf("%d lines \"fetch resumed\", want 1", n)
				}
				t.Logf("%d failed pulls in 5 s; first delivery %v after the pulls work again", tries, resumed)
			})
		})
	}
}
