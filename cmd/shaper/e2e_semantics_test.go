package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The lane semantics of issue 3 end to end: real NATS (the daemon's embedded
// server), real HTTP. Timing bounds carry margins for a noisy 2-core machine.

// scripted is a downstream whose answer per request is chosen by answer
// (status, Retry-After header value or ""). It records each request at the
// kernel's receive timestamp of its first byte (newStampedServer).
type scripted struct {
	srv    *httptest.Server
	answer func(key string, attempt int, since time.Duration) (int, string)
	start  time.Time

	mu       sync.Mutex
	calls    []scriptedCall
	attempts map[string]int
	lastAuth string // Authorization header of the last request
}

type scriptedCall struct {
	at     time.Time // kernel receive timestamp of the request's first byte
	key    string
	status int
}

func newScripted(t *testing.T, answer func(key string, attempt int, since time.Duration) (int, string)) *scripted {
	t.Helper()
	s := &scripted{answer: answer, start: time.Now(), attempts: map[string]int{}}
	s.srv = newStampedServer(t, func(w http.ResponseWriter, r *http.Request, at time.Time) {
		key := r.Header.Get("Idempotency-Key")
		s.mu.Lock()
		s.attempts[key]++
		n := s.attempts[key]
		s.lastAuth = r.Header.Get("Authorization")
		s.mu.Unlock()
		status, retryAfter := 204, ""
		if s.answer != nil {
			status, retryAfter = s.answer(key, n, at.Sub(s.start))
		}
		s.mu.Lock()
		s.calls = append(s.calls, scriptedCall{at: at, key: key, status: status})
		s.mu.Unlock()
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
	})
	return s
}

// snapshot returns the calls so far in arrival order.
func (s *scripted) snapshot() []scriptedCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := slices.Clone(s.calls)
	slices.SortStableFunc(c, func(x, y scriptedCall) int { return x.at.Compare(y.at) })
	return c
}

func (s *scripted) delivered() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := map[string]int{}
	for _, c := range s.calls {
		if c.status/100 == 2 {
			ok[c.key]++
		}
	}
	return ok
}

func (s *scripted) waitDelivered(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(s.delivered()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("after %s only %d of %d delivered", timeout, len(s.delivered()), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// laneYAML renders a config with one lane "sem" whose bucket, rate and task
// sections are given as YAML flow mappings.
func laneYAML(t *testing.T, bucket, rate, task, sinkURL string) string {
	return fmt.Sprintf(`
nats: { url: "", embedded: { listen: "127.0.0.1:0", store_dir: %q } }
admin: { listen: "127.0.0.1:0" }
shutdown: { drain_timeout: 5s }
downstreams:
  sem:
    source: { stream: E2E_SEM, subjects: ["e2e.sem.>"], ack_wait: 60s, max_deliver: 5 }
    bucket: %s
    rate: %s
    task: %s
    sink: { kind: http, url: %q }
`, filepath.Join(t.TempDir(), "nats"), bucket, rate, task, sinkURL)
}

// deadLetters reads the dead-letter stream: key -> Shaper-Reason.
func deadLetters(t *testing.T, js jetstream.JetStream, want int, timeout time.Duration) map[string]string {
	t.Helper()
	out := map[string]string{}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, "SHAPER_DEAD", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"shaper.dead.sem"}})
	if err != nil {
		t.Fatal(err)
	}
	for len(out) < want {
		batch, err := c.Fetch(want-len(out), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			out[m.Headers().Get("Shaper-Key")] = m.Headers().Get("Shaper-Reason")
			if m.Headers().Get("Shaper-Downstream") != "sem" || m.Headers().Get("Shaper-Stream") != "E2E_SEM" {
				t.Errorf("dead letter headers %v", m.Headers())
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

// TestE2EColdStartWarmup: issue 3 — limit 100/s, cold factor 4, period 4 s:
// at most 35 departures in the first second (the ramp's integral, 34.4, plus
// one), and the cumulative count follows the ramp.
func TestE2EColdStartWarmup(t *testing.T) {
	down := newScripted(t, nil)
	d := startDaemon(t, laneYAML(t, "{ capacity: 1000 }", "{ limit: 100/s, warmup: { period: 4s, cold_factor: 4 } }",
		"{ timeout: 5s, max_in_flight: 8 }", down.srv.URL))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	publishBurst(t, js, "e2e.sem.job", 600)
	// The ramp starts when the bucket first holds messages, some
	// milliseconds before the first call reaches the downstream: counted
	// from the first arrival, the integral fell behind the calls by 18.75/s
	// per second of that offset (the lead grew from 1.0 at call 2 to 1.9 by
	// 3 s, and passed 2 in about 1 run in 15). Read the ramp's start from the
	// daemon instead: mid-ramp the rate in force is 25 + 75 × warmth, and the
	// warmth rises by 1/4 per second under the backlog, so the ramp began
	// (rate − 25)/18.75 s before the read.
	time.Sleep(2 * time.Second)
	before := time.Now()
	view := apiLane(t, d.AdminAddr(), "sem")
	after := time.Now()
	read := before.Add(after.Sub(before) / 2)
	if view.Rate <= 25 || view.Rate >= 100 {
		t.Fatalf("rate in force %.2f/s 2 s into the ramp, want between 25 and 100", view.Rate)
	}
	rampStart := read.Add(-time.Duration((view.Rate - 25) / 18.75 * float64(time.Second)))
	down.waitDelivered(t, 600, 30*time.Second)
	calls := down.snapshot()
	// The read gives the latest start of a ramp that rose without a break:
	// the warmth rises by at most 1/4 per second, so at every instant
	// before the read it was at least what that ramp says. But the bucket
	// may empty between the first fetch and the next (the first message
	// leaves at once), and while it is empty the warmth stays at 0 (SPEC
	// §3 Warmup): then the read puts the ramp's start after the first
	// arrival (by 34 ms in one CI run). The rate in force is never below
	// the cold 25/s, so from the first arrival to that start the integral
	// grows by at least 25/s: counting from the earlier of the two keeps
	// the check below SPEC's integral, whatever the bucket did.
	first := rampStart
	if calls[0].at.Before(first) {
		first = calls[0].at
	}
	cold := rampStart.Sub(first).Seconds() // ≥ 0: time at the cold rate before the ramp
	t.Logf("the ramp started %v before the first arrival (read %v after the ramp's start, round trip %v)",
		calls[0].at.Sub(rampStart).Round(time.Microsecond), read.Sub(rampStart).Round(time.Millisecond), after.Sub(before).Round(time.Microsecond))
	integral := func(x float64) float64 { // ∫ rate, cold 25/s rising to 100/s over 4 s after cold s
		if x <= cold {
			return 25 * x
		}
		pre, x := 25*cold, x-cold
		if x <= 4 {
			return pre + 25*x + 75*x*x/8
		}
		return pre + 25*4 + 75*2 + 100*(x-4)
	}
	inFirst, excess := 0, math.Inf(-1)
	for i, c := range calls {
		x := c.at.Sub(first).Seconds()
		if x < 1 {
			inFirst++
		}
		excess = max(excess, float64(i+1)-integral(x))
		// +1.5: one for SPEC's "+1", and half a call for the read of the
		// ramp's start (half its round trip of up to 4 ms at up to 100/s)
		// and the way from departure to the downstream's kernel stamp.
		// Measured from the ramp's start: 0.88–0.99 (4 runs).
		if float64(i+1) > integral(x)+1.5 {
			var around []string
			for j := range min(len(calls), i+4) {
				if j >= 8 && j < i-12 {
					continue
				}
				around = append(around, fmt.Sprintf("%d@%.4fs(%.1f)", j+1, calls[j].at.Sub(first).Seconds(),
					integral(calls[j].at.Sub(first).Seconds())))
			}
			t.Fatalf("call %d at %.3fs exceeds the ramp integral %.1f (+1.5); calls around (n@x(integral)): %s",
				i+1, x, integral(x), strings.Join(around, " "))
		}
	}
	if inFirst > 35 {
		t.Errorf("%d calls in the first second, want ≤ 35", inFirst)
	}
	// Warm after the period: the last 200 arrive at ~100/s.
	tail := calls[len(calls)-200:]
	// At kernel receive timestamps: G1's long-run rate, with the lateness of
	// a loaded machine made up (SPEC G1), over a 2 s tail.
	rate := 199 / tail[len(tail)-1].at.Sub(tail[0].at).Seconds()
	if rate < 97 || rate > 101 {
		t.Errorf("rate once warm %.1f/s, want ~100/s", rate)
	}
	var tailTimes []time.Time
	for _, c := range tail {
		tailTimes = append(tailTimes, c.at)
	}
	t.Logf("%d calls in the ramp's first second; at most %.2f above the ramp integral (allowed 1.5); rate once warm %.2f/s (gaps %s)",
		inFirst, excess, rate, gapSummary(tailTimes))
}

// TestE2ERejectOverflow: issue 3 / case C10 on real NATS — overflow reject
// with max_wait 1.5 s at 10/s: of 30 messages at once about 16 are delivered
// and the rest dead-lettered at once with reason max_wait or overflow; none
// both, none lost.
func TestE2ERejectOverflow(t *testing.T) {
	down := newScripted(t, nil)
	d := startDaemon(t, laneYAML(t, "{ capacity: 20, overflow: reject, max_wait: 1500ms }", "{ limit: 10/s }",
		"{ timeout: 5s, max_in_flight: 8 }", down.srv.URL))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	keys := publishBurst(t, js, "e2e.sem.job", 30)
	time.Sleep(3 * time.Second)
	ok := down.delivered()
	dl := deadLetters(t, js, 30-len(ok), 5*time.Second)
	// The burst reaches the lane in pulls, so the first departure may leave
	// before the last admission: 16 ± 1 fit within max_wait.
	if len(ok) < 15 || len(ok) > 17 {
		t.Errorf("%d delivered, want 16 ± 1", len(ok))
	}
	for _, k := range keys {
		_, delivered := ok[k]
		reason, dead := dl[k]
		switch {
		case delivered && dead:
			t.Errorf("%s delivered and dead-lettered", k)
		case !delivered && !dead:
			t.Errorf("%s lost: neither delivered nor dead-lettered", k)
		case dead && reason != "max_wait" && reason != "overflow":
			t.Errorf("%s dead-lettered with reason %q", k, reason)
		}
		if ok[k] > 1 {
			t.Errorf("%s delivered %d times", k, ok[k])
		}
	}
	samples := scrape(t, d.AdminAddr())
	m := metricValue(t, samples, "shaper_dead_letters_total", map[string]string{"lane": "sem", "reason": "max_wait"}) +
		metricValue(t, samples, "shaper_dead_letters_total", map[string]string{"lane": "sem", "reason": "overflow"})
	if int(m) != len(dl) {
		t.Errorf("shaper_dead_letters_total %v, dead-letter stream holds %d", m, len(dl))
	}
	waitConsumerSettled(t, js, "E2E_SEM", "shaper-sem", 5*time.Second)
}

// TestE2ERetryAfterPausesLane: issue 3 — a 429 with Retry-After: 2 pauses
// the whole lane: no request for ~2 s, then the rate resumes with no burst.
func TestE2ERetryAfterPausesLane(t *testing.T) {
	var once sync.Once
	var pausedAt time.Duration
	down := newScripted(t, func(key string, attempt int, since time.Duration) (int, string) {
		status := 204
		if since > 500*time.Millisecond {
			once.Do(func() { status, pausedAt = 429, since })
		}
		if status == 429 {
			return 429, "2"
		}
		return 204, ""
	})
	d := startDaemon(t, laneYAML(t, "{ capacity: 1000 }", "{ limit: 50/s }", "{ timeout: 5s, max_in_flight: 8 }", down.srv.URL))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	publishBurst(t, js, "e2e.sem.job", 250)
	down.waitDelivered(t, 250, 30*time.Second)
	calls := down.snapshot()
	var t429 time.Time
	for _, c := range calls {
		if c.status == 429 {
			t429 = c.at
		}
	}
	if t429.IsZero() {
		t.Fatal("the downstream never answered 429")
	}
	var next time.Time
	for _, c := range calls {
		if c.at.After(t429) {
			next = c.at
			break
		}
	}
	// The requests already on their way when the 429 came back may still
	// arrive; after that, nothing until the pause ends.
	if gap := next.Sub(t429); gap < 1900*time.Millisecond {
		var early int
		for _, c := range calls {
			if c.at.After(t429) && c.at.Before(t429.Add(1900*time.Millisecond)) {
				early++
			}
		}
		if early > 1 {
			t.Errorf("%d requests within 1.9s after the 429 (Retry-After: 2), want ≤ 1 already in flight", early)
		}
	}
	var ts []time.Time
	for _, c := range calls {
		ts = append(ts, c.at)
	}
	assertRate(t, "1s windows", ts, time.Second, 51) // G1 and G2: the pause earns no credit
	worst, _ := maxInWindow(ts, time.Second)
	if v := metricValue(t, scrape(t, d.AdminAddr()), "shaper_retries_total", map[string]string{"lane": "sem", "reason": "rate_limited"}); v != 1 {
		t.Errorf("retries{rate_limited} = %v, want 1", v)
	}
	t.Logf("429 at %v; next request %v later; worst 1s window %d (bound 51)", pausedAt, next.Sub(t429), worst)
}

// TestE2EBadRequestDeadLetters: issue 3 — a 400 is not retried: the message
// goes to the dead letter with reason rejected_by_sink and is terminated.
func TestE2EBadRequestDeadLetters(t *testing.T) {
	down := newScripted(t, func(key string, attempt int, since time.Duration) (int, string) {
		if key == msgKey(5) {
			return 400, ""
		}
		return 204, ""
	})
	d := startDaemon(t, laneYAML(t, "{ capacity: 100 }", "{ limit: 100/s }", "{ timeout: 5s, max_in_flight: 8 }", down.srv.URL))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	publishBurst(t, js, "e2e.sem.job", 20)
	down.waitDelivered(t, 19, 10*time.Second)
	dl := deadLetters(t, js, 1, 5*time.Second)
	if dl[msgKey(5)] != "rejected_by_sink" {
		t.Errorf("dead letters %v, want %s with rejected_by_sink", dl, msgKey(5))
	}
	time.Sleep(1500 * time.Millisecond) // a retry would come after the 1s backoff
	down.mu.Lock()
	n := down.attempts[msgKey(5)]
	down.mu.Unlock()
	if n != 1 {
		t.Errorf("%s attempted %d times, want 1 (no retry for a 400)", msgKey(5), n)
	}
	waitConsumerSettled(t, js, "E2E_SEM", "shaper-sem", 5*time.Second)
}

// TestE2ETwoLanesOneStream: two lanes on one stream with different subjects
// both consume: the stream is extended to capture the second lane's subjects
// (found by a new-user test: publishes to the second lane failed).
func TestE2ETwoLanesOneStream(t *testing.T) {
	down := newScripted(t, nil)
	cfg := fmt.Sprintf(`
nats: { url: "", embedded: { listen: "127.0.0.1:0", store_dir: %q } }
admin: { listen: "127.0.0.1:0" }
downstreams:
  pay:
    source: { stream: SHARED, subjects: ["shared.pay.>"] }
    rate: { limit: 100/s }
    sink: { kind: http, url: %q }
  refund:
    source: { stream: SHARED, subjects: ["shared.refund.>"] }
    rate: { limit: 100/s }
    sink: { kind: http, url: %q }
`, filepath.Join(t.TempDir(), "nats"), down.srv.URL, down.srv.URL)
	d := startDaemon(t, cfg)
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, subj := range []string{"shared.pay.1", "shared.refund.1"} {
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatalf("publish to %s: %v", subj, err)
		}
	}
	down.waitDelivered(t, 2, 10*time.Second)
}
