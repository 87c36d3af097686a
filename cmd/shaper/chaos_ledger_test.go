package main

// The chaos suite's ledger: every published message accounted for at the
// end of a scenario, and the checks of the downstream's requests.

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/drain"
)

// ledger is the reconciliation of one scenario.
type ledger struct {
	published, delivered, deadLettered, duplicates, requests int
	dupKeys                                                  []string
	maxPerSecond, bound                                      int
	lag                                                      string // handler start after arrival
}

func (l ledger) String() string {
	return fmt.Sprintf("published %d, delivered %d, dead-lettered %d, duplicates %d, downstream requests %d, max %d requests in a 1s window (bound %d) at kernel receive times; handler lag %s",
		l.published, l.delivered, l.deadLettered, l.duplicates, l.requests, l.maxPerSecond, l.bound, l.lag)
}

// reconcile accounts for every published message (SPEC G4): delivered (a
// 2xx answer) or in the dead-letter stream with a Shaper-Reason, never
// both, none missing; at most allowDup duplicate deliveries, each carrying
// the message's own Idempotency-Key; and the rate bound (G1) in every 1 s
// window of downstream arrivals across all shaper runs of the scenario.
func (r *chaosRig) reconcile(allowDup int) ledger {
	t := r.t
	t.Helper()
	reqs := r.down.requests()
	dead := r.deadLetters()
	byKey := attemptsByKey(reqs)
	published := make(map[string]bool, len(r.keys))
	for _, k := range r.keys {
		published[k] = true
	}
	l := ledger{published: len(r.keys), requests: len(reqs)}
	var missing, both []string
	for _, k := range r.keys {
		ok := 0
		for _, q := range byKey[k] {
			if q.status/100 == 2 {
				ok++
			}
		}
		dl := dead[k]
		switch {
		case ok > 0 && dl != nil:
			both = append(both, k)
		case ok == 0 && dl == nil:
			missing = append(missing, k)
		}
		if ok > 0 {
			l.delivered++
		}
		if ok > 1 {
			l.duplicates += ok - 1
			l.dupKeys = append(l.dupKeys, k)
		}
		if dl != nil {
			l.deadLettered++
			if dl.reason == "" {
				t.Errorf("ledger: dead letter of %s has no %s header", k, drain.HeaderReason)
			}
			if dl.copies > 1 {
				t.Errorf("ledger: %s is %d times in the dead-letter stream", k, dl.copies)
			}
		}
	}
	for k, dl := range dead {
		if !published[k] {
			t.Errorf("ledger: dead letter %q (reason %s) was never published", k, dl.reason)
		}
	}
	for _, q := range reqs {
		switch {
		case !published[q.key]:
			t.Errorf("ledger: the downstream got Idempotency-Key %q, which was never published", q.key)
		case q.bodyID != q.key:
			t.Errorf("ledger: a request for message %q carried Idempotency-Key %q", q.bodyID, q.key)
		}
	}
	if len(missing) > 0 {
		t.Errorf("ledger: %d messages LOST (neither delivered nor dead-lettered), e.g. %v", len(missing), missing[:min(20, len(missing))])
	}
	if len(both) > 0 {
		t.Errorf("ledger: %d messages both delivered and dead-lettered, e.g. %v", len(both), both[:min(20, len(both))])
	}
	if l.duplicates > allowDup {
		t.Errorf("ledger: %d duplicate deliveries (keys %v); this fault allows at most %d", l.duplicates, l.dupKeys[:min(20, len(l.dupKeys))], allowDup)
	}
	// G1 at the downstream (SPEC: the bounds hold for what reaches it):
	// requests per 1 s window ≤ floor(limit) + 1 (slack 0), at the kernel's
	// receive timestamps (newStampedServer), across all shaper runs.
	l.bound = int(math.Floor(r.lane.limit)) + 1
	if len(reqs) > 0 {
		ts := make([]time.Time, len(reqs))
		for i, q := range reqs {
			ts[i] = q.at
		}
		var at time.Time
		l.maxPerSecond, at = maxInWindow(ts, time.Second)
		assertRate(t, "ledger: G1 at the downstream, 1s windows", ts, time.Second, l.bound)
		if l.maxPerSecond > l.bound {
			// Which requests came closer than min_spacing (0.95) intervals.
			tight := time.Duration(0.95 * float64(time.Second) / r.lane.limit)
			var pairs []string
			for i := 1; i < len(reqs); i++ {
				q, p := reqs[i], reqs[i-1]
				if q.at.Before(at) || !q.at.Before(at.Add(time.Second)) || q.at.Sub(p.at) >= tight {
					continue
				}
				pairs = append(pairs, fmt.Sprintf("%s(+%s, lag %s) after %s", q.key, q.at.Sub(p.at).Round(time.Microsecond),
					q.handled.Sub(q.at).Round(time.Microsecond), p.key))
			}
			t.Logf("ledger: in that window %d requests came less than 0.95 intervals after the one before: %v", len(pairs), pairs)
		}
		l.lag = handlerLag(reqs)
	}
	t.Logf("LEDGER %s: %s; scenario took %s", t.Name(), l, time.Since(r.began).Round(100*time.Millisecond))
	return l
}

// handlerLag describes how long after its arrival each request's handler
// began: p50, p99 and max. It is what handler timestamps would have added.
func handlerLag(reqs []request) string {
	lags := make([]time.Duration, len(reqs))
	for i, q := range reqs {
		lags[i] = q.handled.Sub(q.at)
	}
	slices.Sort(lags)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("p50 %s, p99 %s, max %s", r(lags[len(lags)/2]), r(lags[len(lags)*99/100]), r(lags[len(lags)-1]))
}

// checkDeliveryCounts asserts that, for every key, the server's delivery
// counts seen at the downstream (X-Shaper-Delivery) are exactly 1, 2, …, k in
// arrival order: every delivery by the server became one attempt, so the
// server never redelivered a message on its own (ack wait) while shaper held
// it (SPEC G7). It returns the number of retries this implies (Σ k−1).
func checkDeliveryCounts(t *testing.T, reqs []request) int {
	t.Helper()
	retries, bad := 0, 0
	for key, rs := range attemptsByKey(reqs) {
		for i, q := range rs {
			if q.delivery != i+1 {
				if bad < 10 {
					t.Errorf("%s: attempt %d carried delivery count %d (all: %v): the server redelivered it on its own",
						key, i+1, q.delivery, deliveryCounts(rs))
				}
				bad++
				break
			}
		}
		retries += len(rs) - 1
	}
	if bad > 0 {
		t.Errorf("%d keys show a server-side redelivery", bad)
	}
	return retries
}

func deliveryCounts(rs []request) []int {
	out := make([]int, len(rs))
	for i, q := range rs {
		out[i] = q.delivery
	}
	return out
}

// statusCounts counts the downstream's answers by status (0 = none).
func statusCounts(reqs []request) map[int]int {
	out := map[int]int{}
	for _, q := range reqs {
		out[q.status]++
	}
	return out
}
