package demo

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/drain"
)

// demoMinRateShare is the share of the limit the downstream must see while a
// backlog waits (SPEC G1: the long-run rate within 0.5 %).
const demoMinRateShare = 0.995

// result is what the downstream saw, judged at its kernel timestamps.
type result struct {
	dups, missing int
	waits         []time.Duration
	minGap        time.Duration // smallest gap between arrivals
	span          time.Duration // first to last accepted request
	busyN         int           // accepted requests while a backlog waited
	busyDur       time.Duration
}

func (res result) perSec(accepted int) float64 {
	if res.span <= 0 {
		return 0
	}
	return float64(accepted-1) / res.span.Seconds()
}

func (res result) busyRate() float64 {
	if res.busyDur <= 0 {
		return 0
	}
	return float64(res.busyN-1) / res.busyDur.Seconds()
}

// judge computes the result; the caller holds down.mu.
func judge(o Options, published []time.Time, down *rigid) result {
	var res result
	for i := range o.total() {
		switch n := down.accepted[demoKey(i)]; {
		case n == 0:
			res.missing++
		case n > 1:
			res.dups += n - 1
		}
	}
	// Reports come in processing order; gaps are between arrivals in time.
	var arrivals []time.Time
	var first, last time.Time
	for _, e := range down.events {
		res.waits = append(res.waits, e.wait)
		arrivals = append(arrivals, e.at)
		if e.accepted {
			if first.IsZero() {
				first = e.at
			}
			last = e.at
		}
	}
	sort.Slice(arrivals, func(i, j int) bool { return arrivals[i].Before(arrivals[j]) })
	for i := 1; i < len(arrivals); i++ {
		if g := arrivals[i].Sub(arrivals[i-1]); i == 1 || g < res.minGap {
			res.minGap = g
		}
	}
	res.span = last.Sub(first)
	res.busyN, res.busyDur = busySpan(published, down.events)
	return res
}

// summarize prints the summary and the verdict, and reports whether the
// demo passed. timedOut: --timeout passed first (info is nil then: the
// lane's messages were handed back, not settled).
func summarize(w io.Writer, o Options, pub *publisher, down *rigid, info *jetstream.ConsumerInfo, sum drain.Summary, timedOut bool) bool {
	published, pubErr := pub.snapshot()
	down.mu.Lock()
	defer down.mu.Unlock()
	res := judge(o, published, down)
	fmt.Fprintf(w, "\nsummary: published %d, delivered %d distinct in %.2fs (%.1f/s), downstream 429s %d, duplicates %d, missing %d\n",
		o.total(), len(down.accepted), res.span.Seconds(), res.perSec(len(down.accepted)), down.rejected, res.dups, res.missing)
	fmt.Fprintf(w, "         delivered rate while a backlog waited: %.2f/s over %.2fs (%d requests), %.2f %% of the limit %g/s\n",
		res.busyRate(), res.busyDur.Seconds(), res.busyN, 100*res.busyRate()/o.Limit, o.Limit)
	fmt.Fprintf(w, "         smallest gap seen by the downstream %v (it rejects below %v); p99 queue wait %s\n",
		res.minGap.Round(time.Microsecond), down.minGap.Round(time.Microsecond), p99(res.waits))
	if info != nil {
		fmt.Fprintf(w, "         consumer: %d pending, %d unacknowledged, %d redelivered; drain: %d delivered, %d handed back\n",
			info.NumPending, info.NumAckPending, info.NumRedelivered, sum.Delivered, sum.Nacked)
	} else if timedOut {
		fmt.Fprintf(w, "         drain at the timeout: %d handed back to the stream\n", sum.Nacked)
	}
	// SPEC G1: the full rate under a backlog (within 0.5 %), judged only
	// over a busy span long enough to mean it (≥ 2 s).
	short := res.busyDur >= 2*time.Second && res.busyRate() < demoMinRateShare*o.Limit
	pending := !timedOut && (info == nil || info.NumAckPending != 0 || info.NumPending != 0)
	if pubErr != nil {
		fmt.Fprintf(w, "publish error: %v\n", pubErr)
	}
	var why []string
	if timedOut {
		why = append(why, fmt.Sprintf("timed out after %s with %d of %d delivered", o.Timeout, len(down.accepted), o.total()))
	}
	if res.missing > 0 {
		why = append(why, fmt.Sprintf("%d not delivered before --timeout (handed back to the stream, not lost; raise --timeout)", res.missing))
	}
	if down.rejected > 0 {
		why = append(why, fmt.Sprintf("the downstream rejected %d requests (429)", down.rejected))
	}
	if pubErr != nil {
		why = append(why, "a publish failed")
	}
	if short {
		why = append(why, fmt.Sprintf("the downstream saw %.2f/s under a backlog, below %.1f %% of the limit %g/s",
			res.busyRate(), 100*demoMinRateShare, o.Limit))
	}
	if pending {
		why = append(why, "the consumer still had messages pending when the demo stopped")
	}
	if len(why) > 0 {
		fmt.Fprintf(w, "result: FAILED — %s\n", strings.Join(why, "; "))
		return false
	}
	fmt.Fprintln(w, "result: OK — nothing lost, no request rejected by the downstream")
	return true
}

// busySpan returns the accepted requests of the first busy span — from the
// first accepted request up to the last one that left while another message
// had already been published and was waiting — and the span's length,
// judged at the downstream's timestamps.
func busySpan(published []time.Time, events []rigidEvent) (int, time.Duration) {
	var acc []time.Time
	for _, e := range events {
		if e.accepted {
			acc = append(acc, e.at)
		}
	}
	sort.Slice(acc, func(i, j int) bool { return acc[i].Before(acc[j]) })
	pub := append([]time.Time(nil), published...)
	sort.Slice(pub, func(i, j int) bool { return pub[i].Before(pub[j]) })
	n, p := 0, 0
	for i, a := range acc {
		for p < len(pub) && !pub[p].After(a) {
			p++
		}
		n = i + 1
		if p <= i+1 { // nothing else waited when this one left
			break
		}
	}
	if n < 2 {
		return n, 0
	}
	return n, acc[n-1].Sub(acc[0])
}
