package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/shaper"
)

// publishWith publishes jobs to subject with Nats-Msg-Id keys[i] and the
// headers of header(i) (nil: none), and waits for every publish ack.
func publishWith(t *testing.T, js jetstream.JetStream, subject string, keys []string, header func(i int) nats.Header) {
	t.Helper()
	futures := make([]jetstream.PubAckFuture, 0, len(keys))
	for i, k := range keys {
		msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: fmt.Appendf(nil, `{"key":%q}`, k)}
		if header != nil {
			for name, vals := range header(i) {
				msg.Header[name] = vals
			}
		}
		msg.Header.Set(jetstream.MsgIDHeader, k)
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			t.Fatalf("publish %s: %v", k, err)
		}
		futures = append(futures, f)
	}
	timeout := time.After(10 * time.Second)
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("publish %s: %v", keys[i], err)
		case <-timeout:
			t.Fatalf("publish acks: timed out at %d of %d", i, len(keys))
		}
	}
}

func keysOf(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// splitArrivals returns the arrivals (kernel receive times) whose key starts
// with prefix, in arrival order.
func splitArrivals(a []arrival, prefix string) []arrival {
	var out []arrival
	for _, x := range a {
		if strings.HasPrefix(x.key, prefix) {
			out = append(out, x)
		}
	}
	return out
}

// TestE2ENotBefore: SPEC §3 Per-message control through the daemon on real
// NATS, judged at the downstream's kernel receive times — 100 messages with
// Shaper-Not-Before 3 s ahead are published first, then 100 due now, at
// 50/s: the due ones leave at once at the rate (the held ones at the head
// of the stream block nothing), the others after 3 s, none before its
// Not-Before; G1's 1 s windows hold over all 200; each key arrives once.
func TestE2ENotBefore(t *testing.T) {
	down := newDownstream(t, nil)
	d := startDaemon(t, laneYAML(t, "{ capacity: 500 }", "{ limit: 50/s }", "{ timeout: 5s, max_in_flight: 8 }", down.url()))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	published := time.Now()
	due := published.Add(3 * time.Second)
	later, now := keysOf("later", 100), keysOf("now", 100)
	publishWith(t, js, "e2e.sem.job", later, func(int) nats.Header {
		return nats.Header{shaper.NotBeforeHeader: {due.UTC().Format(time.RFC3339Nano)}}
	})
	publishWith(t, js, "e2e.sem.job", now, nil)
	down.waitDistinct(t, 200, 15*time.Second)
	waitConsumerSettled(t, js, "E2E_SEM", "shaper-sem", 5*time.Second)
	all, ok := down.snapshot()
	for k, n := range ok {
		if n != 1 {
			t.Errorf("%s delivered %d times, want 1", k, n)
		}
	}
	if len(all) != 200 {
		t.Errorf("%d requests at the downstream, want 200", len(all))
	}
	nowA, laterA := splitArrivals(all, "now-"), splitArrivals(all, "later-")
	if len(nowA) != 100 || len(laterA) != 100 {
		t.Fatalf("%d due and %d held arrivals, want 100 each", len(nowA), len(laterA))
	}
	first, last := nowA[0].at.Sub(published), nowA[len(nowA)-1].at.Sub(published)
	t.Logf("due now: first %s, last %s after the publish; held: first %s, last %s after their Not-Before",
		first.Round(time.Millisecond), last.Round(time.Millisecond),
		laterA[0].at.Sub(due).Round(time.Millisecond), laterA[len(laterA)-1].at.Sub(due).Round(time.Millisecond))
	if first > time.Second {
		t.Errorf("the first due message arrived %s after the publish: the held ones blocked it", first)
	}
	// 100 at 50/s: 99 intervals of 20 ms, 1.98 s (the make-up of
	// min_spacing 0.95 may shorten it by at most 5 %).
	if span := nowA[len(nowA)-1].at.Sub(nowA[0].at); span < 1850*time.Millisecond || span > 2300*time.Millisecond {
		t.Errorf("the 100 due messages took %s, want about 1.98 s (50/s)", span)
	}
	for _, a := range laterA {
		if a.at.Before(due) {
			t.Errorf("%s arrived %s before its Not-Before", a.key, due.Sub(a.at))
		}
	}
	if end := laterA[len(laterA)-1].at.Sub(due); end > 3500*time.Millisecond {
		t.Errorf("the last held message arrived %s after its Not-Before, want about 2 s (100 at 50/s)", end)
	}
	assertRate(t, "G1 at the downstream, 1 s windows", times(all), time.Second, 51)
	if n := metricValue(t, scrape(t, d.AdminAddr()), "shaper_retries_total", map[string]string{"lane": "sem", "reason": "not_before"}); n < 100 {
		t.Errorf("shaper_retries_total{reason=not_before} = %v, want ≥ 100 (one hold per held message)", n)
	}
}

// TestE2EDeadline: SPEC §3 Per-message control through the daemon — 200
// messages at 50/s, every other one with Shaper-Deadline 1 s after the
// publish: the ones that would depart later are dead-lettered "expired"
// (none arrives after its deadline), take no departure slot (after the
// deadline the others keep arriving at 50/s, not 25/s), and every message
// is delivered or dead-lettered, never both.
func TestE2EDeadline(t *testing.T) {
	down := newDownstream(t, nil)
	d := startDaemon(t, laneYAML(t, "{ capacity: 500 }", "{ limit: 50/s }", "{ timeout: 5s, max_in_flight: 8 }", down.url()))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	published := time.Now()
	deadline := published.Add(time.Second)
	keys := make([]string, 200)
	for i := range keys {
		if i%2 == 1 {
			keys[i] = fmt.Sprintf("short-%03d", i)
		} else {
			keys[i] = fmt.Sprintf("keep-%03d", i)
		}
	}
	publishWith(t, js, "e2e.sem.job", keys, func(i int) nats.Header {
		if i%2 == 0 {
			return nil
		}
		return nats.Header{shaper.DeadlineHeader: {fmt.Sprintf("%.6f", float64(deadline.UnixMicro())/1e6)}}
	})
	down.waitDistinct(t, 100, 15*time.Second) // at least the 100 kept ones
	waitConsumerSettled(t, js, "E2E_SEM", "shaper-sem", 10*time.Second)
	all, ok := down.snapshot()
	keepA, shortA := splitArrivals(all, "keep-"), splitArrivals(all, "short-")
	if len(keepA) != 100 {
		t.Errorf("%d of the 100 messages without a deadline arrived, want all", len(keepA))
	}
	// The check is at departure; the request reaches the kernel a little
	// later (loopback, a loaded machine: 50 ms of margin).
	for _, a := range shortA {
		if a.at.After(deadline.Add(50 * time.Millisecond)) {
			t.Errorf("%s arrived %s after its deadline", a.key, a.at.Sub(deadline))
		}
	}
	dead := deadLetters(t, js, 100-len(shortA), 10*time.Second)
	if len(dead) != 100-len(shortA) {
		t.Errorf("%d dead letters, want %d (the short ones not delivered)", len(dead), 100-len(shortA))
	}
	for k, reason := range dead {
		if !strings.HasPrefix(k, "short-") || reason != shaper.ReasonExpired {
			t.Errorf("dead letter %s with reason %s, want only short-* expired", k, reason)
		}
		if ok[k] > 0 {
			t.Errorf("%s both delivered and dead-lettered", k)
		}
	}
	if n := metricValue(t, scrape(t, d.AdminAddr()), "shaper_dead_letters_total", map[string]string{"lane": "sem", "reason": "expired"}); int(n) != len(dead) {
		t.Errorf("shaper_dead_letters_total{expired} = %v, want %d", n, len(dead))
	}
	// After the deadline only kept messages remain: at 50/s, not at the
	// 25/s they would get if each expired one still took its slot.
	var after []time.Time
	for _, a := range all {
		if a.at.After(deadline.Add(100 * time.Millisecond)) {
			after = append(after, a.at)
		}
	}
	slices.SortFunc(after, func(x, y time.Time) int { return x.Compare(y) })
	if len(after) < 50 {
		t.Fatalf("only %d arrivals after the deadline", len(after))
	}
	rate := float64(len(after)-1) / after[len(after)-1].Sub(after[0]).Seconds()
	t.Logf("%d short ones delivered before the deadline, %d expired; after it %d arrivals at %.2f/s",
		len(shortA), len(dead), len(after), rate)
	if rate < 48 || rate > 52.7 {
		t.Errorf("after the deadline the others arrived at %.2f/s, want 50/s (expired messages take no slot)", rate)
	}
	assertRate(t, "G1 at the downstream, 1 s windows", times(all), time.Second, 51)
}
