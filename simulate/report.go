package simulate

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/shaper-dev/shaper/shaper/shapertest"
)

// Second is one row of the per-second table.
type Second struct {
	Second            int
	Arrived, Departed int
	Depth             int // bucket depth at the end of the second
	DeadLetters       int
	P99Wait           time.Duration // of the departures in that second
	HasWait           bool
}

// Seconds returns the per-second table, from second 0 to the last event.
func (r Result) Seconds() []Second {
	end := time.Duration(0)
	for _, a := range r.Arrivals {
		end = max(end, a.At)
	}
	if n := len(r.Departures); n > 0 {
		end = max(end, r.Departures[n-1].At)
	}
	if n := len(r.DeadLetters); n > 0 {
		end = max(end, r.DeadLetters[n-1].At)
	}
	rows := make([]Second, int(end/time.Second)+1)
	waits := make([][]time.Duration, len(rows))
	for i := range rows {
		rows[i].Second = i
	}
	for _, a := range r.Arrivals {
		rows[a.At/time.Second].Arrived++
	}
	for _, d := range r.Departures {
		i := d.At / time.Second
		rows[i].Departed++
		waits[i] = append(waits[i], d.Wait())
	}
	for _, d := range r.DeadLetters {
		rows[d.At/time.Second].DeadLetters++
	}
	j := 0
	for i := range rows {
		for j+1 < len(r.Depth) && r.Depth[j+1].At < time.Duration(i+1)*time.Second {
			j++
		}
		if j < len(r.Depth) && r.Depth[j].At < time.Duration(i+1)*time.Second {
			rows[i].Depth = r.Depth[j].Depth
		}
		if w := waits[i]; len(w) > 0 {
			rows[i].P99Wait, rows[i].HasWait = percentile(w, 99), true
		}
	}
	return rows
}

// percentile is the p-th percentile of w by the nearest-rank method: the
// smallest wait with at least p % of the waits at or below it (the p50 of
// two waits is the lower one, the p99 of 100 the 99th, not the largest).
// w must not be empty; p is in (0, 100].
func percentile(w []time.Duration, p int) time.Duration {
	w = slices.Clone(w)
	slices.Sort(w)
	rank := (len(w)*p + 99) / 100 // ceil(p/100 × n), 1-based
	return w[max(0, min(len(w), rank)-1)]
}

// WriteTable prints the demo's per-second table: arrived, departed, bucket
// depth, dead letters and the p99 queue wait of each second.
func (r Result) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%6s %8s %9s %7s %6s %14s\n", "second", "arrived", "departed", "bucket", "dead", "p99 queue wait")
	for _, s := range r.Seconds() {
		wait := "-"
		if s.HasWait {
			wait = s.P99Wait.Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "%6d %8d %9d %7d %6d %14s\n", s.Second, s.Arrived, s.Departed, s.Depth, s.DeadLetters, wait)
	}
}

// Summary is the run in a few numbers.
type Summary struct {
	Arrived, Delivered int
	DeadLetters        map[string]int // by reason
	P50Wait, P99Wait   time.Duration
	// WorstWindow is the most departures in any 1 s window [x, x+1s), and
	// WorstAt where it starts.
	WorstWindow int
	WorstAt     time.Duration
	// QuotaWait is the time spent waiting for rate.quota (the sum of
	// Result.QuotaWaits), and WorstQuotaWindow the most departures in any
	// window [x, x+per) of the quota; both 0 without a quota.
	QuotaWait        time.Duration
	WorstQuotaWindow int
}

// Summarize computes the summary.
func (r Result) Summarize() Summary {
	s := Summary{Arrived: len(r.Arrivals), Delivered: len(r.Departures), DeadLetters: map[string]int{}}
	for _, d := range r.DeadLetters {
		s.DeadLetters[d.Reason]++
	}
	if len(r.Departures) > 0 {
		w := make([]time.Duration, len(r.Departures))
		ts := make([]time.Time, len(r.Departures))
		for i, d := range r.Departures {
			w[i], ts[i] = d.Wait(), Epoch.Add(d.At)
		}
		s.P50Wait, s.P99Wait = percentile(w, 50), percentile(w, 99)
		n, at := shapertest.MaxInWindow(ts, time.Second)
		s.WorstWindow, s.WorstAt = n, at.Sub(Epoch)
		if r.Quota.Count > 0 && r.Quota.Per > 0 {
			s.WorstQuotaWindow, _ = shapertest.MaxInWindow(ts, r.Quota.Per)
		}
	}
	for _, q := range r.QuotaWaits {
		s.QuotaWait += q.Until - q.From
	}
	return s
}

// WriteSummary prints the summary: delivered, dead letters by reason, the
// p50 and p99 queue wait and the worst 1 s window.
func (r Result) WriteSummary(w io.Writer) {
	s := r.Summarize()
	fmt.Fprintf(w, "\nsummary: arrived %d, delivered %d, dead letters %d", s.Arrived, s.Delivered, len(r.DeadLetters))
	reasons := make([]string, 0, len(s.DeadLetters))
	for k := range s.DeadLetters {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	for i, k := range reasons {
		sep := ", "
		if i == 0 {
			sep = " ("
		}
		fmt.Fprintf(w, "%s%s %d", sep, k, s.DeadLetters[k])
	}
	if len(reasons) > 0 {
		fmt.Fprint(w, ")")
	}
	fmt.Fprintf(w, "\n         queue wait p50 %s, p99 %s (from arrival to departure)\n",
		s.P50Wait.Round(time.Millisecond), s.P99Wait.Round(time.Millisecond))
	fmt.Fprintf(w, "         worst 1 s window: %d departures from %.3fs (limit %g/s)\n", s.WorstWindow, s.WorstAt.Seconds(), r.Limit)
	if r.Quota.Count > 0 {
		fmt.Fprintf(w, "         quota %d per %s: %d waits, %.3fs in all, worst %s window: %d departures\n",
			r.Quota.Count, r.Quota.Per, len(r.QuotaWaits), s.QuotaWait.Seconds(), r.Quota.Per, s.WorstQuotaWindow)
	}
}
