package demo

import (
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// printTable prints one row per second (arrived, departed, bucket depth,
// 429s, p99 queue wait) until every message was delivered once or
// o.Timeout passed; timedOut reports the latter.
func printTable(w io.Writer, o Options, start time.Time, pub *publisher, down *rigid, depth prometheus.Gauge) (timedOut bool) {
	gauge := func(g prometheus.Gauge) float64 {
		var m dto.Metric
		_ = g.Write(&m)
		return m.GetGauge().GetValue()
	}
	fmt.Fprintf(w, "%6s %8s %9s %7s %6s %14s\n", "second", "arrived", "departed", "bucket", "429s", "p99 queue wait")
	deadline := start.Add(o.Timeout)
	for sec := 1; ; sec++ {
		time.Sleep(time.Until(start.Add(time.Duration(sec) * time.Second)))
		from, to := start.Add(time.Duration(sec-1)*time.Second), start.Add(time.Duration(sec)*time.Second)
		published, _ := pub.snapshot()
		arrived := countIn(published, from, to)
		departed, rejected, waits, unique := down.second(from, to)
		fmt.Fprintf(w, "%6d %8d %9d %7.0f %6d %14s\n", sec, arrived, departed, gauge(depth), rejected, p99(waits))
		if unique >= o.total() && len(published) >= o.total() {
			return false
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(w, "timed out after %s: what the lane still holds goes back to the stream\n", o.Timeout)
			return true
		}
	}
}

// second returns the requests that arrived in [from, to), how many of them
// were rejected, their queue waits, and the distinct keys accepted so far.
func (r *rigid) second(from, to time.Time) (departed, rejected int, waits []time.Duration, unique int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if !e.at.Before(from) && e.at.Before(to) {
			departed++
			if !e.accepted {
				rejected++
			}
			waits = append(waits, e.wait)
		}
	}
	return departed, rejected, waits, len(r.accepted)
}

func countIn(ts []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range ts {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

func p99(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	v := s[min(len(s)-1, int(float64(len(s))*0.99))]
	return v.Round(time.Millisecond).String()
}
