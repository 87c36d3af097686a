package drain

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/shaper"
)

// Tests of the lane's rules that a careful implementation gets wrong (issue
// 10's list of changes the suite must catch), on the fake clock.

// TestCase_C34_RunningTasksGetInProgress: hexpm/hexpm#1825, nats.go#1929 —
// a sink call longer than ack wait keeps its message with in-progress acks,
// so the server never hands it out again while the call runs. Run 1 of C34:
// ack_wait 4 s, timeout 15 s, max_in_flight 4, 2/s, capacity 8, 8 messages
// held 10 s each by the downstream: exactly 8 calls, each acked once with
// delivery count 1, no redelivery, departures at 0, 0.5, 1.0, 1.5 then 10.0,
// 10.5, 11.0, 11.5.
func TestCase_C34_RunningTasksGetInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(call) (time.Duration, error) { return 10 * time.Second, nil }}
		cfg := laneConfig(2)
		cfg.Source.AckWait = 4 * time.Second
		cfg.Task.Timeout = 15 * time.Second
		cfg.Task.MaxInFlight = 4
		cfg.Bucket.Capacity = 8
		h := newHarness(t, cfg, sink)
		h.src.Publish(8)
		start := time.Now()
		h.lane.Start()
		time.Sleep(23 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		if len(cs) != 8 {
			t.Fatalf("%d calls, want 8 (one per message)", len(cs))
		}
		want := []float64{0, 0.5, 1.0, 1.5, 10.0, 10.5, 11.0, 11.5}
		for i, c := range cs {
			if c.attempt != 1 {
				t.Errorf("call %d with delivery count %d, want 1", i, c.attempt)
			}
			if got := c.at.Sub(start).Seconds(); got < want[i]-0.05 || got > want[i]+0.05 {
				t.Errorf("departure %d at %.3fs, want %.1f ± 0.05", i, got, want[i])
			}
		}
		if h.src.Redelivered() != 0 {
			t.Errorf("%d redeliveries by ack wait while the calls ran, want 0", h.src.Redelivered())
		}
		if n := h.src.Count("acked"); n != 8 {
			t.Errorf("%d acked, want 8", n)
		}
	})
}

// TestLaneMaxAgeAtDeparture: SPEC §3 Max age — a 429 with Retry-After 30 s
// pauses the lane; with max_age 5 s the waiting messages are dead-lettered
// as they pass 5 s (not when the pause ends, not delivered 30 s old), and
// the message that fails with the 429 comes back later than max_age too.
func TestLaneMaxAgeAtDeparture(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			if time.Since(start) < time.Second {
				return 0, &shaper.SinkError{Status: 429, RetryAfter: 30 * time.Second, Saturated: true}
			}
			return 0, nil
		}}
		cfg := laneConfig(10)
		cfg.Bucket.MaxAge = 5 * time.Second
		h := newHarness(t, cfg, sink)
		h.src.Publish(20)
		h.lane.Start()
		time.Sleep(7 * time.Second)
		synctest.Wait()
		dead := h.dead.snapshot()
		if len(dead) != 19 {
			t.Errorf("%d dead letters 7 s into a 30 s pause, want 19 (all but the one that got the 429)", len(dead))
		}
		for _, d := range dead {
			if at := d.at.Sub(start); at < 5*time.Second || at > 5500*time.Millisecond {
				t.Errorf("dead-lettered at %v, want as it passed max_age 5 s (≤ 5.5 s)", at)
			}
			if r := d.header[HeaderReason]; len(r) != 1 || r[0] != shaper.ReasonExpired {
				t.Errorf("reason %v, want expired", r)
			}
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		for _, c := range sink.snapshot() {
			if age := c.at.Sub(start); age > 5*time.Second {
				t.Errorf("a message was delivered %v after its publish, max_age 5 s", age)
			}
		}
		if got := testutil.ToFloat64(h.m.DeadLetters[shaper.ReasonExpired]); got != 20 {
			t.Errorf("dead_letters{expired} = %v, want 20", got)
		}
	})
}

// TestLaneMaxAgeCountsFromPublish: the age counts from the stream's publish
// time, not from the admission: messages published 4 s before they reach
// the lane, with max_age 5 s at 1/s, expire 1 s after admission. An expired
// message takes no departure slot: the next one leaves at its time.
func TestLaneMaxAgeCountsFromPublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(1)
		cfg.Bucket.MaxAge = 5 * time.Second
		h := newHarness(t, cfg, sink)
		h.src.SetPublishedAgo(4 * time.Second)
		h.src.Publish(10)
		start := time.Now()
		h.lane.Start()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		h.src.SetPublishedAgo(0)
		h.src.Publish(3) // fresh: delivered at once, at the rate
		time.Sleep(5 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		cs := sink.snapshot()
		var old, fresh []call
		for _, c := range cs {
			if c.id < "msg-10" || len(c.id) == len("msg-1") {
				old = append(old, c)
			} else {
				fresh = append(fresh, c)
			}
		}
		// At 1/s the first two leave at 0 and 1 s (ages 4 and 5 s); the
		// third would leave at 2 s, 6 s old: it and the rest expire.
		if len(old) != 2 {
			t.Errorf("%d of the back-dated messages delivered, want 2 (the rest older than 5 s)", len(old))
		}
		if len(fresh) != 3 {
			t.Fatalf("%d fresh messages delivered, want 3", len(fresh))
		}
		if at := fresh[0].at.Sub(start); at > 10*time.Second+10*time.Millisecond {
			t.Errorf("first fresh message at %v: the expired ones took departure slots", at)
		}
	})
}

// TestLaneInvalidReleasesItsSlot: an invalid message (dead-lettered at
// admission) gives back the bucket slot the fetch reserved for it; a lane
// of capacity 2 in block mode that receives 10 invalid messages still
// fetches and delivers the valid ones after them.
func TestLaneInvalidReleasesItsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(100)
		cfg.Bucket.Capacity = 2
		cfg.Source.MaxMessageBytes = 6 // "msg-N" is 5 bytes; "msg-NN" 6
		h := newHarness(t, cfg, sink)
		h.src.Publish(10)
		for _, m := range h.src.Messages() {
			h.src.SetData(m.ID, append(m.Data, []byte("-too-long")...))
		}
		h.src.Publish(20)
		h.lane.Start()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if n := len(sink.snapshot()); n != 20 {
			t.Errorf("%d valid messages delivered after 10 invalid ones, want 20", n)
		}
		if n := len(h.dead.snapshot()); n != 10 {
			t.Errorf("%d dead letters, want the 10 invalid", n)
		}
		if free := h.lane.bucket.Free(); free != 2 {
			t.Errorf("bucket has %d free slots at the end, want 2 (none leaked)", free)
		}
	})
}

// TestLaneMaxWaitCountsThePause: in reject mode the projected wait includes
// a Retry-After pause: with max_wait 2 s, messages arriving during a 10 s
// pause are dead-lettered max_wait at once instead of waiting past it.
func TestLaneMaxWaitCountsThePause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		sink := &recSink{behave: func(c call) (time.Duration, error) {
			if c.id == "msg-0" && time.Since(start) < time.Second {
				return 0, &shaper.SinkError{Status: 503, RetryAfter: 10 * time.Second, Saturated: true}
			}
			return 0, nil
		}}
		cfg := laneConfig(10)
		cfg.Bucket.Overflow = "reject"
		cfg.Bucket.MaxWait = 2 * time.Second
		h := newHarness(t, cfg, sink)
		h.src.Publish(1)
		h.lane.Start()
		time.Sleep(time.Second)
		synctest.Wait()
		h.src.Publish(5) // arrive 9 s before the pause ends
		time.Sleep(time.Second)
		synctest.Wait()
		var maxWait int
		for _, d := range h.dead.snapshot() {
			if r := d.header[HeaderReason]; len(r) == 1 && r[0] == shaper.ReasonMaxWait {
				maxWait++
			}
		}
		if maxWait != 5 {
			t.Errorf("%d dead letters max_wait for arrivals 9 s before a pause ends (max_wait 2 s), want 5", maxWait)
		}
		time.Sleep(15 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		for _, d := range h.dead.snapshot() {
			if got := strings.Join(d.header[HeaderAttempts], ""); got != "0" {
				t.Errorf("max_wait dead letter says %s attempts, want 0 (never attempted)", got)
				break
			}
			if got, ok := d.header[HeaderLastStatus]; ok {
				t.Errorf("max_wait dead letter has %s %v, want none (never attempted)", HeaderLastStatus, got)
				break
			}
		}
	})
}

// TestLaneMaxAgeAtTheDepartureInstant: the age is checked at the instant of
// departure, after the pacer's wait, not only before it: at 100/s with
// max_age 1 s and messages published 900 ms before the lane starts, message
// k would leave at k × 10 ms, 900 + 10k ms old: exactly the first 11 (ages
// up to 1.000 s) are delivered, and message 11, which passes max_age while
// it waits for its departure, is not.
func TestLaneMaxAgeAtTheDepartureInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{}
		cfg := laneConfig(100)
		cfg.Bucket.MaxAge = time.Second
		h := newHarness(t, cfg, sink)
		h.src.SetPublishedAgo(900 * time.Millisecond)
		h.src.Publish(30)
		h.lane.Start()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		h.stop(time.Second)
		if n := len(sink.snapshot()); n != 11 {
			t.Errorf("%d delivered, want 11 (those at most 1 s old when they depart)", n)
		}
		if n := len(h.dead.snapshot()); n != 19 {
			t.Errorf("%d dead-lettered expired, want 19", n)
		}
	})
}
