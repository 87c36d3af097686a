package drain

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaper-dev/shaper/config"
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

// pullLog records what each pull asked for and what it brought.
type pullLog struct {
	*sourcetest.Mem
	mu    sync.Mutex // guards asked and got, logged when a pull ends
	asked []int
	got   []int
}

func (s *pullLog) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	got := 0
	err := s.Mem.Fetch(ctx, max, func(m *shaper.Message) { got++; deliver(m) })
	s.mu.Lock()
	s.asked, s.got = append(s.asked, max), append(s.got, got)
	s.mu.Unlock()
	return err
}

// take returns the pulls logged since the last take.
func (s *pullLog) take() (asked, got []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	asked, got = s.asked, s.got
	s.asked, s.got = nil, nil
	return asked, got
}

// startPullLog starts a lane of cfg on a pullLog source (under synctest).
func startPullLog(t *testing.T, cfg config.Lane) (*Lane, *pullLog, *recSink) {
	t.Helper()
	src := &pullLog{Mem: sourcetest.NewMem(cfg.Source.AckWait)}
	sink := &recSink{}
	l, err := New("test", cfg, src, sink, WithWaiter(TimerWaiter{}), WithDeadLetter(&recSink{}))
	if err != nil {
		t.Fatal(err)
	}
	l.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		l.Drain(ctx)
		cancel()
		src.Close()
	})
	return l, src, sink
}

// allMinPull reports whether every pull asked for minPull.
func allMinPull(asked []int) bool {
	return !slices.ContainsFunc(asked, func(a int) bool { return a != minPull })
}

// TestFetchPullSize: a quiet lane asks for minPull messages a pull, not for
// its whole free bucket (nats.go allocates per message asked, every pull);
// a pull that comes back full doubles the next, and the loop pulls again at
// once, so a backlog of 1,000 fills a bucket of 1,000 in 6 pulls; once the
// lane is quiet again its pulls shrink back to minPull.
func TestFetchPullSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, src, sink := startPullLog(t, laneConfig(10))
		time.Sleep(5500 * time.Millisecond)
		synctest.Wait()
		asked, _ := src.take()
		if len(asked) < 5 {
			t.Fatalf("%d pulls in 5.5 s of a quiet lane, want one a second", len(asked))
		}
		if !allMinPull(asked) {
			t.Fatalf("a quiet lane's pulls asked for %v, want %d each", asked, minPull)
		}

		src.Publish(1000)
		synctest.Wait()
		asked, got := src.take()
		t.Logf("filling: asked %v, got %v", asked, got)
		// The sixth pull, for the slots still free (8, or 9 once the first
		// message left), brings the last 8: it ends if it asked for 8, and
		// waits for more if it asked for 9.
		if want := []int{32, 64, 128, 256, 512}; len(asked) < 5 || len(asked) > 6 || !slices.Equal(asked[:5], want) || (len(asked) == 6 && asked[5] != 8) {
			t.Errorf("a backlog of 1,000 was pulled as %v, want %v and then the rest", asked, want)
		}
		if n, sent := l.bucket.Len(), len(sink.snapshot()); n+sent != 1000 {
			t.Errorf("bucket holds %d and %d were sent after the backlog's pulls, want all 1000 in the bucket (capacity 1000)", n, sent)
		}

		// 10/s: the bucket is empty after 100 s; the pulls shrink back.
		time.Sleep(110 * time.Second)
		synctest.Wait()
		src.take()
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		asked, _ = src.take()
		if !allMinPull(asked) {
			t.Errorf("quiet again, the pulls asked for %v, want %d each", asked, minPull)
		}
		if len(sink.snapshot()) != 1000 {
			t.Errorf("%d delivered, want 1000", len(sink.snapshot()))
		}
	})
}

// TestFetchPullSizeReject: with overflow "reject" (no reservation), a
// quiet lane's pulls ask for minPull too, not for 256.
func TestFetchPullSizeReject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(10)
		cfg.Bucket.Overflow = "reject"
		_, src, _ := startPullLog(t, cfg)
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		asked, _ := src.take()
		if len(asked) < 3 || !allMinPull(asked) {
			t.Errorf("a quiet lane with overflow reject asked for %v, want %d each, one a second", asked, minPull)
		}
	})
}
