package drain

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/config"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/shaper/shapertest"
)

// TestLaneOperatorHold: a timed hold stops departures for its span and ends
// by itself; a hold with no end lasts until Resume; neither is followed by
// a burst (SPEC §3 Operator control, G1/G2), and nothing is nak'd.
func TestLaneOperatorHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		sink := &recSink{}
		h := newHarness(t, laneConfig(10), sink)
		h.src.Publish(200)
		h.lane.Start()
		time.Sleep(2 * time.Second)
		h.lane.Hold(Hold{Until: start.Add(5 * time.Second), Reason: "maintenance"})
		time.Sleep(500 * time.Millisecond)
		st := h.lane.Status(time.Now())
		if st.State != StatePaused || st.Hold == nil || st.Hold.Reason != "maintenance" || !st.PausedUntil.Equal(start.Add(5*time.Second)) {
			t.Errorf("status during the hold = %+v, want paused until +5s for maintenance", st)
		}
		if got := testutil.ToFloat64(h.m.Paused); got != 1 {
			t.Errorf("shaper_lane_paused = %v during the hold, want 1", got)
		}
		time.Sleep(5500 * time.Millisecond) // t = 8 s
		h.lane.Hold(Hold{Reason: "until resumed"})
		time.Sleep(4 * time.Second) // t = 12 s
		if _, held := h.lane.HoldState(time.Now()); !held {
			t.Error("a hold with no end ended by itself")
		}
		h.lane.Resume()
		time.Sleep(3 * time.Second) // t = 15 s
		synctest.Wait()
		if n := h.lane.Status(time.Now()).Nacked; n != 0 {
			t.Errorf("%d nak'd: a hold must not hand messages back", n)
		}
		h.stop(time.Second)
		cs := sink.snapshot()
		var in1, in2, after int
		for _, c := range cs {
			switch at := c.at.Sub(start); {
			case at > 2*time.Second && at < 5*time.Second:
				in1++
			case at > 8*time.Second && at < 12*time.Second:
				in2++
			case at >= 12*time.Second && at < 15*time.Second:
				after++
			}
		}
		if in1 != 0 || in2 != 0 {
			t.Errorf("%d departures during the timed hold and %d during the open-ended one, want 0", in1, in2)
		}
		if after < 29 || after > 31 {
			t.Errorf("%d departures in the 3 s after Resume at 10/s, want 30 ± 1", after)
		}
		if w := maxInWindow(times(cs), time.Second); w > 11 {
			t.Errorf("%d departures in a 1 s window, bound 11 (a burst after a hold)", w)
		}
		if g, _ := shapertest.MinGap(times(cs)); g < 9500*time.Microsecond {
			t.Errorf("smallest gap %v, want ≥ min_spacing × 100ms", g)
		}
	})
}

// TestLanePurge: what the lane holds up to the purge's stream sequence and
// what it receives later up to it go to the dead letter as purged; the
// newer messages are delivered; nothing is lost.
func TestLanePurge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(100)
		cfg.Bucket.Capacity = 20
		sink := &recSink{}
		h := newHarness(t, cfg, sink)
		h.lane.Hold(Hold{Reason: "before purge"})
		h.src.Publish(50)
		h.lane.Start()
		time.Sleep(time.Second)
		if d := h.lane.Status(time.Now()).Depth; d != 20 {
			t.Fatalf("depth %d before the purge, want the full bucket (20)", d)
		}
		if n := h.lane.Purge(PurgeMark{UpTo: 30}); n != 20 {
			t.Errorf("Purge took %d from the bucket, want 20", n)
		}
		time.Sleep(time.Second)
		h.lane.Resume()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		purged := 0
		for i, d := range h.dead.snapshot() {
			if d.header[HeaderReason][0] != shaper.ReasonPurged {
				t.Errorf("dead letter with reason %q, want purged", d.header[HeaderReason][0])
			}
			if want := fmt.Sprintf("msg-%d", i); d.id != want {
				t.Errorf("dead letter %d is %s, want %s: purged in the stream's order", i, d.id, want)
			}
			purged++
		}
		if purged != 30 || len(sink.snapshot()) != 20 {
			t.Errorf("%d purged and %d delivered, want 30 and 20", purged, len(sink.snapshot()))
		}
		if n := h.src.Count("acked") + h.src.Count("termed"); n != 50 {
			t.Errorf("%d of 50 settled", n)
		}
		for _, c := range sink.snapshot() {
			if c.id <= "msg-29" && len(c.id) == len("msg-29") {
				t.Errorf("%s delivered after a purge up to sequence 30", c.id)
			}
		}
	})
}

// TestRecentStats: the achieved rate counts whole seconds of the last 10;
// the p99 is of the last waits.
func TestRecentStats(t *testing.T) {
	var r recentStats
	t0 := time.Unix(1000, 0)
	for i := range 200 { // 20/s over [1000 s, 1010 s)
		r.depart(t0.Add(time.Duration(i)*50*time.Millisecond), time.Duration(i)*time.Millisecond)
	}
	if rate, p99 := r.read(t0.Add(10 * time.Second)); rate != 20 || p99 != 198*time.Millisecond {
		t.Errorf("read = %v/s, p99 %v; want 20/s, 198ms", rate, p99)
	}
	if rate, _ := r.read(t0.Add(15 * time.Second)); rate != 10 {
		t.Errorf("5 s later: %v/s, want 10/s (half the window idle)", rate)
	}
}

// TestLaneOperatorHoldCoolsAndLogsItsEnd: a lane held by an operator for
// longer than its warmup period cools as if idle, so the departures after a
// timed hold ends follow the warmup ramp again (no jump to the full rate);
// the end of the hold is logged by itself.
func TestLaneOperatorHoldCoolsAndLogsItsEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(100)
		cfg.Rate.Warmup = config.Warmup{Period: 2 * time.Second, ColdFactor: 4}
		var logs bytes.Buffer
		h := newHarness(t, cfg, sink)
		h.lane.log = slog.New(slog.NewTextHandler(&logs, nil)).With("lane", "test")
		h.src.Publish(2000)
		h.lane.Start()
		time.Sleep(4 * time.Second) // warm: 100/s
		resumeAt := time.Now().Add(5 * time.Second)
		h.lane.Hold(Hold{Until: resumeAt, Reason: "cool down"})
		time.Sleep(7 * time.Second) // 5 s held (cooled fully), then 2 s
		synctest.Wait()
		h.stop(time.Second)
		var after []time.Time
		for _, c := range sink.snapshot() {
			if !c.at.Before(resumeAt) && c.at.Before(resumeAt.Add(2*time.Second)) {
				after = append(after, c.at)
			}
		}
		// Cold again: 25/s rising to 100/s over 2 s, ≈ 125 in the ramp's 2 s
		// (the integral of 25 + 75·x/2 over [0, 2]), not 200.
		if n := len(after); n > 130 || n < 110 {
			t.Errorf("%d departures in the 2 s after the hold, want ≈ 125 (the warmup ramp), not 200 (warm)", n)
		}
		if !strings.Contains(logs.String(), "operator pause ended") {
			t.Errorf("the end of the timed hold is not logged:\n%s", logs.String())
		}
	})
}

// TestLaneRetryAfterPauseEndIsLogged: the end of a downstream's Retry-After
// pause is logged once (it used to end silently).
func TestLaneRetryAfterPauseEndIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var once sync.Once
		sink := &recSink{behave: func(call) (time.Duration, error) {
			var err error
			once.Do(func() { err = &shaper.SinkError{Status: 429, RetryAfter: time.Second, Saturated: true} })
			return 0, err
		}}
		var logs bytes.Buffer
		h := newHarness(t, laneConfig(10), sink)
		h.lane.log = slog.New(slog.NewTextHandler(&logs, nil)).With("lane", "test")
		h.src.Publish(30)
		h.lane.Start()
		time.Sleep(4 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if n := strings.Count(logs.String(), "downstream pause ended"); n != 1 {
			t.Errorf("%d lines say the Retry-After pause ended, want 1:\n%s", n, logs.String())
		}
	})
}

// TestPurgeMark: a purge covers its stream's messages up to its sequence
// that the stream stored by its time; a recreated stream (sequences from 1
// again, stored later) and another stream are not covered; records of
// earlier versions (no stream, no time) are judged by the sequence; a later
// purge of the same stream raises both, one of another stream replaces it.
func TestPurgeMark(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	p := PurgeMark{Stream: "JOBS", UpTo: 300, Before: t0}
	msg := func(stream string, seq uint64, pub time.Time) *shaper.Message {
		return &shaper.Message{Stream: stream, StreamSeq: seq, Published: pub}
	}
	for _, c := range []struct {
		name string
		mark PurgeMark
		m    *shaper.Message
		want bool
	}{
		{"under it", p, msg("JOBS", 300, t0), true},
		{"redelivered later, stored before", p, msg("JOBS", 1, t0.Add(-time.Hour)), true},
		{"after its sequence", p, msg("JOBS", 301, t0.Add(time.Second)), false},
		{"recreated stream: low sequence, stored after", p, msg("JOBS", 5, t0.Add(time.Millisecond)), false},
		{"another stream", p, msg("OTHER", 5, t0.Add(-time.Hour)), false},
		{"no publish time: by sequence", p, msg("JOBS", 5, time.Time{}), true},
		{"a record of an earlier version", PurgeMark{UpTo: 300}, msg("OTHER", 5, t0.Add(time.Hour)), true},
		{"no purge", PurgeMark{}, msg("JOBS", 0, time.Time{}), false},
	} {
		if got := c.mark.Covers(c.m); got != c.want {
			t.Errorf("%s: Covers = %v, want %v", c.name, got, c.want)
		}
	}
	if got := p.Merge(PurgeMark{Stream: "JOBS", UpTo: 400, Before: t0.Add(time.Minute)}); got.UpTo != 400 || !got.Before.Equal(t0.Add(time.Minute)) {
		t.Errorf("a later purge of the same stream: %+v, want 400 and its time", got)
	}
	if got := p.Merge(PurgeMark{Stream: "JOBS", UpTo: 100, Before: t0.Add(-time.Minute)}); got.UpTo != 300 || !got.Before.Equal(t0) {
		t.Errorf("an older record applied again: %+v, want the mark unchanged", got)
	}
	if got := p.Merge(PurgeMark{Stream: "NEW", UpTo: 7, Before: t0}); got.Stream != "NEW" || got.UpTo != 7 {
		t.Errorf("a purge of another stream: %+v, want it alone", got)
	}
}

// TestDeadLetterID: the dead letter's Nats-Msg-Id tells apart two jobs under
// one key from a recreated stream (the same "<stream>:<seq>", published at
// different times), which the dead-letter stream's duplicate window would
// otherwise store once and the second lost; the same job again keeps its
// id; a replay's dead letter has an id of its own.
func TestDeadLetterID(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 13, 0, 0, 0, time.UTC)
	first := &shaper.Message{Stream: "CALLBACKS", StreamSeq: 1, Published: t0}
	again := &shaper.Message{Stream: "CALLBACKS", StreamSeq: 1, Published: t0}
	recreated := &shaper.Message{Stream: "CALLBACKS", StreamSeq: 1, Published: t0.Add(30 * time.Second)}
	replay := &shaper.Message{Stream: "CALLBACKS", StreamSeq: 9, Published: t0,
		Header: map[string][]string{shaper.KeyHeader: {"CALLBACKS:1"}, shaper.ReplayOfHeader: {"4"}}}
	id := deadLetterID("payments", first)
	if id != deadLetterID("payments", again) {
		t.Errorf("the same job dead-lettered again: %q and %q, want one id", id, deadLetterID("payments", again))
	}
	if id == deadLetterID("payments", recreated) {
		t.Errorf("two jobs of a recreated stream under key %s share the id %q: the second dead letter would be dropped", first.Key(), id)
	}
	if r := deadLetterID("payments", replay); r == id || !strings.HasSuffix(r, "/replay-4") {
		t.Errorf("a replay's dead letter id %q, want its own, ending /replay-4", r)
	}
	if got := deadLetterID("payments", &shaper.Message{Stream: "S", StreamSeq: 2}); got != "payments/S:2" {
		t.Errorf("no publish time: %q, want payments/S:2", got)
	}
}

// TestLaneDrainAfterHeldMessagesExpired: a lane held by an operator whose
// messages all pass bucket.max_age (the housekeeping sweep dead-letters them
// while the departure loop waits for the hold's end) drains at once: the
// bucket is empty, so nothing is left to wait for. Found by a new-user pass:
// the stop waited the whole drain_timeout (30 s by default).
func TestLaneDrainAfterHeldMessagesExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(5)
		cfg.Bucket.Capacity, cfg.Bucket.MaxAge = 10, 2*time.Second
		h := newHarness(t, cfg, &recSink{})
		h.lane.Hold(Hold{Reason: "until resumed"})
		h.lane.Start()
		h.src.Publish(3)
		time.Sleep(4 * time.Second) // all three expired and dead-lettered
		synctest.Wait()
		if d := h.lane.Status(time.Now()).Depth; d != 0 {
			t.Fatalf("bucket depth %d after max_age, want 0", d)
		}
		drainsAtOnce(t, h, "an empty held lane")
	})
	// The same when an operator's purge empties the held bucket.
	synctest.Test(t, func(t *testing.T) {
		cfg := laneConfig(5)
		cfg.Bucket.Capacity = 10
		h := newHarness(t, cfg, &recSink{})
		h.lane.Hold(Hold{Reason: "until resumed"})
		h.lane.Start()
		h.src.Publish(3)
		time.Sleep(time.Second)
		if n := h.lane.Purge(PurgeMark{UpTo: 3}); n != 3 {
			t.Fatalf("purge took %d from the bucket, want 3", n)
		}
		synctest.Wait()
		drainsAtOnce(t, h, "a held lane emptied by a purge")
	})
}

// drainsAtOnce drains h's lane with a 4 s budget and wants it done within
// 1.5 s, with no leftovers and the 3 messages dead-lettered.
func drainsAtOnce(t *testing.T, h *harness, what string) {
	t.Helper()
	start := time.Now()
	s := h.stop(4 * time.Second)
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("drain of %s took %v, want it at once (not the 4 s budget)", what, took)
	}
	if s.Leftovers != 0 || len(h.dead.snapshot()) != 3 {
		t.Errorf("summary %+v, %d dead letters; want no leftovers and 3 dead letters", s, len(h.dead.snapshot()))
	}
}
