package drain

import (
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// Tests of SPEC §3 Per-message control (Shaper-Not-Before, Shaper-Deadline)
// on the fake clock.

// unixValue is a header value in Unix seconds (with nanoseconds) for t.
func unixValue(t time.Time) []string {
	return []string{strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 9, 64)}
}

// TestLaneNotBeforeDoesNotBlock: 10 messages due in 10 s at the head of the
// stream, then 20 due now, at 10/s, capacity 2 (block): the 20 leave at
// once at the rate (the held ones hold no bucket slot and do not block
// them), the 10 leave after 10 s, none before its Not-Before, each with one
// hold nak of the delay it still had to wait.
func TestLaneNotBeforeDoesNotBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(10)
		cfg.Bucket.Capacity = 2
		h := newHarness(t, cfg, sink)
		start := time.Now()
		due := start.Add(10 * time.Second)
		var hs []map[string][]string
		for range 10 {
			hs = append(hs, map[string][]string{shaper.NotBeforeHeader: unixValue(due)})
		}
		for range 20 {
			hs = append(hs, nil)
		}
		h.src.PublishHeaders(hs...)
		h.lane.Start()
		time.Sleep(15 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 30 {
			t.Fatalf("%d calls, want 30", len(cs))
		}
		for i, c := range cs[:20] {
			n, _ := strconv.Atoi(strings.TrimPrefix(c.id, "msg-"))
			if n < 10 {
				t.Fatalf("call %d is %s, a held message, before the due ones", i, c.id)
			}
			// 10/s from the start: the held ones took no slot and no time.
			if at := c.at.Sub(start); at < time.Duration(i)*100*time.Millisecond-time.Millisecond || at > time.Duration(i)*100*time.Millisecond+5*time.Millisecond {
				t.Errorf("due message %s left at %v, want %v (10/s from the start)", c.id, at, time.Duration(i)*100*time.Millisecond)
			}
		}
		for _, c := range cs[20:] {
			if c.at.Before(due) {
				t.Errorf("held message %s left at %v, before its Not-Before 10 s", c.id, c.at.Sub(start))
			}
			if c.attempt != 2 {
				t.Errorf("held message %s delivered with count %d, want 2 (one hold)", c.id, c.attempt)
			}
		}
		if got := cs[29].at.Sub(due); got > time.Second {
			t.Errorf("the last held message left %v after its Not-Before, want ≤ 1 s (10 at 10/s)", got)
		}
		for _, m := range h.src.Messages()[:10] {
			if len(m.Verbs) == 0 || m.Verbs[0] != "nak@1" {
				t.Errorf("message %d verbs %v, want a nak first", m.ID, m.Verbs)
			}
		}
		if got := testutil.ToFloat64(h.m.Retries[shaper.RetryNotBefore]); got != 10 {
			t.Errorf("retries{not_before} = %v, want 10", got)
		}
		if n := h.src.Count(sourcetest.Acked); n != 30 {
			t.Errorf("%d acked, want 30", n)
		}
	})
}

// TestLaneNotBeforeLongHold: a Not-Before 12 minutes ahead is held in naks
// of at most shaper.MaxHold (5 min, 5 min, then the 2 min left), and
// delivered at 12 minutes.
func TestLaneNotBeforeLongHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		h := newHarness(t, laneConfig(10), sink)
		start := time.Now()
		due := start.Add(12 * time.Minute)
		h.src.PublishHeaders(map[string][]string{shaper.NotBeforeHeader: {due.UTC().Format(time.RFC3339Nano)}})
		h.lane.Start()
		time.Sleep(6 * time.Minute)
		synctest.Wait()
		if n := len(sink.snapshot()); n != 0 {
			t.Fatalf("delivered %d after 6 min of a 12 min hold", n)
		}
		d := h.src.Messages()[0].Delivered
		if d != 2 {
			t.Errorf("after 6 min delivered %d times, want 2 (a nak capped at 5 min came back and was held again)", d)
		}
		time.Sleep(7 * time.Minute)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 1 {
			t.Fatalf("%d calls, want 1", len(cs))
		}
		if at := cs[0].at.Sub(start); at < 12*time.Minute || at > 12*time.Minute+time.Second {
			t.Errorf("delivered at %v, want at 12 min", at)
		}
		if cs[0].attempt != 4 {
			t.Errorf("delivered with count %d, want 4 (3 holds)", cs[0].attempt)
		}
	})
}

// TestLaneNotBeforeHoldsAreNotAttempts: source.max_deliver 3 counts sink
// attempts, not holds: a message held 3 times (12 min) that always fails
// gets 3 calls, then is dead-lettered max_deliver with Shaper-Attempts 3.
func TestLaneNotBeforeHoldsAreNotAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(call) (time.Duration, error) { return 0, &shaper.SinkError{Status: 500} }}
		cfg := laneConfig(10)
		cfg.Source.MaxDeliver = 3
		h := newHarness(t, cfg, sink)
		h.src.PublishHeaders(map[string][]string{shaper.NotBeforeHeader: unixValue(time.Now().Add(12 * time.Minute))})
		h.lane.Start()
		time.Sleep(14 * time.Minute)
		synctest.Wait()
		h.stop(time.Second)
		if n := len(sink.snapshot()); n != 3 {
			t.Errorf("%d sink calls, want 3 (max_deliver 3; the 3 holds are not attempts)", n)
		}
		dead := h.dead.snapshot()
		if len(dead) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dead))
		}
		if r := dead[0].header[HeaderReason]; len(r) != 1 || r[0] != shaper.ReasonMaxDeliver {
			t.Errorf("reason %v, want max_deliver", r)
		}
		if a := dead[0].header[HeaderAttempts]; len(a) != 1 || a[0] != "3" {
			t.Errorf("Shaper-Attempts %v, want 3", a)
		}
	})
}

// TestLaneDeadlineAtDeparture: 20 messages at 10/s, the odd ones with a
// deadline 1 s after the start: the odd ones that would leave after it are
// dead-lettered expired and take no departure slot (the even ones keep
// leaving 100 ms apart); none leaves after its deadline.
func TestLaneDeadlineAtDeparture(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		h := newHarness(t, laneConfig(10), sink)
		start := time.Now()
		deadline := start.Add(time.Second)
		var hs []map[string][]string
		for i := range 20 {
			if i%2 == 1 {
				hs = append(hs, map[string][]string{shaper.DeadlineHeader: unixValue(deadline)})
			} else {
				hs = append(hs, nil)
			}
		}
		h.src.PublishHeaders(hs...)
		h.lane.Start()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		// Until 1 s: 11 departures (0, 0.1, … 1.0 s: msg-0 … msg-10); then
		// the 9 even ones left (msg-12 … msg-18 are 4; the odd ones expire).
		if len(cs) != 15 {
			t.Errorf("%d calls, want 15 (11 before the deadline, then the 4 even ones left)", len(cs))
		}
		for i, c := range cs {
			n, _ := strconv.Atoi(strings.TrimPrefix(c.id, "msg-"))
			if n%2 == 1 && c.at.After(deadline) {
				t.Errorf("%s left at %v, after its deadline 1 s", c.id, c.at.Sub(start))
			}
			if want := time.Duration(i) * 100 * time.Millisecond; c.at.Sub(start) > want+5*time.Millisecond {
				t.Errorf("departure %d (%s) at %v, want %v: an expired message took a slot", i, c.id, c.at.Sub(start), want)
			}
		}
		dead := h.dead.snapshot()
		if len(dead) != 5 {
			t.Fatalf("%d dead letters, want 5 (msg-11 … msg-19, odd)", len(dead))
		}
		for _, d := range dead {
			if r := d.header[HeaderReason]; len(r) != 1 || r[0] != shaper.ReasonExpired {
				t.Errorf("%s: reason %v, want expired", d.id, r)
			}
			if e := d.header[HeaderLastError]; len(e) != 1 || !strings.Contains(e[0], shaper.DeadlineHeader) {
				t.Errorf("%s: last error %v, want it to name %s", d.id, e, shaper.DeadlineHeader)
			}
		}
	})
}

// TestLaneDeadlineWhilePaused: with no max_age, a lane paused by a
// Retry-After dead-letters messages as they pass their deadline, not when
// the pause ends (the housekeeping sweep covers deadlines too).
func TestLaneDeadlineWhilePaused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			if c.id == "msg-0" && c.attempt == 1 {
				return 0, &shaper.SinkError{Status: 429, RetryAfter: 30 * time.Second, Saturated: true}
			}
			return 0, nil
		}}
		h := newHarness(t, laneConfig(10), sink)
		h.src.PublishHeaders(nil, map[string][]string{shaper.DeadlineHeader: unixValue(start.Add(3 * time.Second))})
		h.lane.Start()
		time.Sleep(4 * time.Second)
		synctest.Wait()
		dead := h.dead.snapshot()
		if len(dead) != 1 {
			t.Fatalf("%d dead letters 4 s into a 30 s pause, want 1 (its deadline was 3 s)", len(dead))
		}
		if at := dead[0].at.Sub(start); at < 3*time.Second || at > 3500*time.Millisecond {
			t.Errorf("dead-lettered at %v, want as it passed its deadline (3 s, ≤ 3.5 s)", at)
		}
		h.stop(time.Second)
	})
}

// TestLaneTimingInvalid: a malformed Shaper-Not-Before or Shaper-Deadline
// dead-letters the message with reason invalid, naming the header; nothing
// is delivered, nothing crashes, the messages behind go on; a deadline
// before the Not-Before is expired at once, without a hold.
func TestLaneTimingInvalid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		h := newHarness(t, laneConfig(10), sink)
		now := time.Now()
		h.src.PublishHeaders(
			map[string][]string{shaper.NotBeforeHeader: {"next tuesday"}},
			map[string][]string{shaper.DeadlineHeader: {"2026-13-45T00:00:00Z"}},
			map[string][]string{shaper.NotBeforeHeader: unixValue(now.Add(time.Hour)), shaper.DeadlineHeader: unixValue(now.Add(time.Minute))},
			nil)
		h.lane.Start()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if cs := sink.snapshot(); len(cs) != 1 || cs[0].id != "msg-3" {
			t.Errorf("calls %v, want only msg-3", cs)
		}
		want := map[string][2]string{
			"msg-0": {shaper.ReasonInvalid, "header Shaper-Not-Before:"},
			"msg-1": {shaper.ReasonInvalid, "header Shaper-Deadline:"},
			"msg-2": {shaper.ReasonExpired, "past its Shaper-Deadline"},
		}
		dead := h.dead.snapshot()
		if len(dead) != 3 {
			t.Fatalf("%d dead letters, want 3", len(dead))
		}
		for _, d := range dead {
			w := want[d.id]
			if r := d.header[HeaderReason]; len(r) != 1 || r[0] != w[0] {
				t.Errorf("%s: reason %v, want %s", d.id, r, w[0])
			}
			if e := d.header[HeaderLastError]; len(e) != 1 || !strings.Contains(e[0], w[1]) {
				t.Errorf("%s: last error %v, want %q", d.id, e, w[1])
			}
		}
		if v := h.src.Messages()[2].Verbs; len(v) != 1 || v[0] != "term@1" {
			t.Errorf("msg-2 verbs %v, want only a term (no hold nak)", v)
		}
	})
}
