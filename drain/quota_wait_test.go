package drain

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// TestLaneQuotaHoldsOnlyWhenItBinds: under a backlog each window of the
// quota after the first replays the first one's spacing, so between two
// departures the quota frees its slot exactly when the pacer does. That is
// not a wait: the lane logs "quota spent" once per wait (three waits in
// 12 s of quota 100 per 5 s at 50/s: from 1.98 s, 6.982 s and 11.984 s), and the pacer is not held between the
// departures of a window (quotaUntil's paced rule).
func TestLaneQuotaHoldsOnlyWhenItBinds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(50)
		cfg.Rate.Quota.Count, cfg.Rate.Quota.Per = 100, 5*time.Second
		rec := &logRecorder{}
		h := &harness{t: t, src: sourcetest.NewMem(cfg.Source.AckWait), sink: sink, dead: &recSink{}, reg: prometheus.NewRegistry()}
		h.m = metrics.New(h.reg).Lane("test", float64(cfg.Rate.Limit))
		l, err := New("test", cfg, h.src, sink, WithWaiter(TimerWaiter{}), WithMetrics(h.m), WithDeadLetter(h.dead),
			WithLogger(slog.New(rec)))
		if err != nil {
			t.Fatal(err)
		}
		h.lane = l
		h.src.Publish(400)
		l.Start()
		time.Sleep(6 * time.Second) // inside the second window, between departures
		synctest.Wait()
		l.mu.Lock()
		held := l.pacer.Held()
		l.mu.Unlock()
		if held {
			t.Errorf("the pacer is held between two departures of the second window: the quota did not bind there")
		}
		time.Sleep(6 * time.Second)
		h.stop(time.Millisecond)
		if n := rec.count(slog.LevelInfo, "quota spent"); n != 3 {
			t.Errorf("%d \"quota spent\" lines in 12 s, want 3 (one per wait)", n)
		}
		if n := len(sink.snapshot()); n != 300 {
			t.Errorf("%d calls by 12 s, want 300 (100 from 0, 5.002 s and 10.004 s)", n)
		}
	})
}

// spentOnce is a fakeSchedule whose shared quota answers "spent" to the
// first reservations, with an instant that has already passed on the
// lane's clock (a round trip converted it late), then grants slots.
type spentOnce struct {
	fakeSchedule
	spent int // "spent" answers still to give
}

func (s *spentOnce) Reserve(ctx context.Context, r SlotRequest) (time.Time, error) {
	s.mu.Lock()
	if s.spent > 0 {
		s.spent--
		s.mu.Unlock()
		return time.Time{}, &QuotaWait{Until: time.Now().Add(-time.Millisecond)}
	}
	s.mu.Unlock()
	return s.fakeSchedule.Reserve(ctx, r)
}

// spentTwice is a fakeSchedule whose shared quota answers "spent for
// wait" to the first spent reservations, each from the instant it is asked:
// the second comes when the first wait ends, as when another replica took
// the slot that freed.
type spentTwice struct {
	fakeSchedule
	spent int
	wait  time.Duration
}

func (s *spentTwice) Reserve(ctx context.Context, r SlotRequest) (time.Time, error) {
	s.mu.Lock()
	if s.reserves >= 5 && s.spent > 0 {
		s.spent--
		s.mu.Unlock()
		return time.Time{}, &QuotaWait{Until: time.Now().Add(s.wait)}
	}
	s.mu.Unlock()
	return s.fakeSchedule.Reserve(ctx, r)
}

// TestGlobalQuotaSecondWaitLogsOnce: a global lane whose wait for the
// shared quota ends only to be told "spent" again (another replica took
// the slot that freed) is in the same wait: one "quota spent" line, one
// "quota renewed" line at the departure that ends it, and the lane stays
// paused across both answers (seen as 6–8 lines a replica in 8.7 s, for
// 3–5 waits, in redisslots' TestGlobalQuotaTwoReplicas).
func TestGlobalQuotaSecondWaitLogsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &spentTwice{fakeSchedule: fakeSchedule{share: 1}, spent: 2, wait: 300 * time.Millisecond}
		rec := &recSink{}
		logs := &logRecorder{}
		h := startQuotaGlobal(t, rec, g, slog.New(logs))
		// 5 departures by 80 ms, then two waits of 300 ms: paused at
		// 0.2 s and at 0.5 s (the second), departures again after 0.7 s.
		var paused []bool
		for _, d := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond} {
			time.Sleep(d)
			synctest.Wait()
			paused = append(paused, h.lane.Status(time.Now()).QuotaWait)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if n := len(rec.snapshot()); n != 20 {
			t.Errorf("%d departures, want 20", n)
		}
		if paused[0] != true || paused[1] != true {
			t.Errorf("quota wait at 0.2 s and 0.5 s: %v, want true, true (one wait across both answers)", paused)
		}
		if n := logs.count(slog.LevelInfo, "quota spent"); n != 1 {
			t.Errorf("%d \"quota spent\" lines, want 1 (one wait, answered spent twice)", n)
		}
		if n := logs.count(slog.LevelInfo, "quota renewed"); n != 1 {
			t.Errorf("%d \"quota renewed\" lines, want 1 (at the departure that ends the wait)", n)
		}
	})
}

// TestGlobalQuotaWaitInThePast: a "spent until" answer whose instant has
// passed still took no slot: the lane asks again and departs only with a
// slot (departures = slots granted), the quota's wait shows in the
// requests (QuotaCount and QuotaPer sent), and Status counts what remains
// from the lane's own ring when the schedule does not report it.
func TestGlobalQuotaWaitInThePast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &spentOnce{fakeSchedule: fakeSchedule{share: 1}, spent: 3}
		rec := &recSink{}
		h := startQuotaGlobal(t, rec, g, nil)
		time.Sleep(time.Second)
		synctest.Wait()
		st := h.lane.Status(time.Now())
		h.stop(time.Second)
		g.mu.Lock()
		defer g.mu.Unlock()
		if n := len(rec.snapshot()); n != 20 || g.reserves != 20 {
			t.Errorf("%d departures, %d slots granted; want 20 each (none without a slot)", n, g.reserves)
		}
		if g.spent != 0 {
			t.Errorf("%d spent answers left, want all 3 given", g.spent)
		}
		if r := g.reqs[0]; r.QuotaCount != 1000 || r.QuotaPer != time.Hour {
			t.Errorf("request %+v, want the quota 1000 per 1h", r)
		}
		if st.QuotaRemaining != 1000-20 {
			t.Errorf("quota remaining %d, want 980 (the lane's own ring)", st.QuotaRemaining)
		}
	})
}

// startQuotaGlobal starts a global lane at 50/s (replicas_hint 2) on g with
// a quota of 1000 per hour and 20 messages waiting.
func startQuotaGlobal(t *testing.T, sink Sink, g GlobalSchedule, log *slog.Logger) *harness {
	t.Helper()
	h := newGlobalHarness(t, 50, sink, g, 2, log)
	cfg := *h.lane.conf()
	cfg.Rate.Quota.Count, cfg.Rate.Quota.Per = 1000, time.Hour
	if err := h.lane.Update(cfg); err != nil {
		t.Fatal(err)
	}
	h.src.Publish(20)
	h.lane.Start()
	return h
}

// spentScript is a fakeSchedule whose shared quota answers "spent until
// until(now)" once at each number of slots reserved that it lists.
type spentScript struct {
	fakeSchedule
	at map[int]func(now time.Time) time.Time
}

func (s *spentScript) Reserve(ctx context.Context, r SlotRequest) (time.Time, error) {
	s.mu.Lock()
	if until, ok := s.at[s.reserves]; ok {
		delete(s.at, s.reserves)
		s.mu.Unlock()
		return time.Time{}, &QuotaWait{Until: until(time.Now())}
	}
	s.mu.Unlock()
	return s.fakeSchedule.Reserve(ctx, r)
}

// TestGlobalQuotaShortWaitInWindowLogsDebug: laneQuota.loudUntil — a wait
// that ends within per of where the last logged wait ended is in the
// window that wait opened (a replay of a slower window before it): it
// holds the lane like any wait, but logs at Debug; the next window's wait
// logs at Info again (quota 2 s; waits at 5, 10 and 15 slots: until 1.1 s,
// 50 ms long, and until 3.2 s).
func TestGlobalQuotaShortWaitInWindowLogsDebug(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		g := &spentScript{fakeSchedule: fakeSchedule{share: 1}, at: map[int]func(time.Time) time.Time{
			5:  func(time.Time) time.Time { return start.Add(1100 * time.Millisecond) },
			10: func(now time.Time) time.Time { return now.Add(50 * time.Millisecond) },
			15: func(time.Time) time.Time { return start.Add(3200 * time.Millisecond) },
		}}
		rec := &recSink{}
		logs := &logRecorder{}
		h := newGlobalHarness(t, 50, rec, g, 2, slog.New(logs))
		cfg := *h.lane.conf()
		cfg.Rate.Quota.Count, cfg.Rate.Quota.Per = 1000, 2*time.Second
		if err := h.lane.Update(cfg); err != nil {
			t.Fatal(err)
		}
		h.src.Publish(20)
		h.lane.Start()
		time.Sleep(4 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if n := len(rec.snapshot()); n != 20 {
			t.Errorf("%d departures, want 20", n)
		}
		info, debug := logs.count(slog.LevelInfo, "quota spent"), logs.count(slog.LevelDebug, "quota spent again within its window")
		if info != 2 || debug != 1 {
			t.Errorf("\"quota spent\" lines: %d at Info, %d at Debug, want 2 (the windows' waits) and 1 (the 50 ms wait inside a window)", info, debug)
		}
		if n := logs.count(slog.LevelInfo, "quota renewed"); n != 2 {
			t.Errorf("%d \"quota renewed\" lines at Info, want 2", n)
		}
	})
}
