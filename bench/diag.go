package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
)

// recWaiter wraps the lane's waiter (drain.WithWaiter) and records how late
// each timed wait returned, to explain the lane's achieved rate.
type recWaiter struct {
	inner drain.Waiter
	mu    sync.Mutex
	late  []time.Duration
}

func (w *recWaiter) Bind() { w.inner.Bind() }

// Unwrap returns the waiter it wraps: the lane then runs short tasks in
// line with a precise one, as without the wrapper (drain.WithWaiter).
func (w *recWaiter) Unwrap() drain.Waiter { return w.inner }

func (w *recWaiter) Unbind() { w.inner.Unbind() }

func (w *recWaiter) Wait(ctx context.Context, t time.Time, wake <-chan struct{}) (bool, error) {
	woke, err := w.inner.Wait(ctx, t, wake)
	if err == nil && !woke {
		late := time.Since(t)
		w.mu.Lock()
		w.late = append(w.late, late)
		w.mu.Unlock()
	}
	return woke, err
}

// lateness summarises the recorded wake-ups against the interval iv.
type lateness struct {
	waits     int
	p50, p99  time.Duration
	max       time.Duration
	mean      time.Duration
	meanPct   float64 // mean lateness in % of an interval
	over1pct  int     // later than 1 % of an interval: more than one departure can make up
	over90pct int     // later than 0.9 interval: the excess is forgiven at once
}

func (w *recWaiter) summary(iv time.Duration) lateness {
	w.mu.Lock()
	xs := slices.Clone(w.late)
	w.mu.Unlock()
	slices.Sort(xs)
	l := lateness{waits: len(xs)}
	if len(xs) == 0 {
		return l
	}
	l.p50, l.p99, l.max = quantile(xs, 0.5), quantile(xs, 0.99), xs[len(xs)-1]
	var sum time.Duration
	for _, x := range xs {
		sum += x
		if x > iv/100 {
			l.over1pct++
		}
		if x > time.Duration(0.9*float64(iv)) {
			l.over90pct++
		}
	}
	l.mean = sum / time.Duration(len(xs))
	l.meanPct = 100 * float64(l.mean) / float64(iv)
	return l
}

// countSource wraps a lane's source and counts its pull requests.
type countSource struct {
	inner   drain.Source
	fetches atomic.Int64
	asked   atomic.Int64
}

func (s *countSource) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	s.fetches.Add(1)
	s.asked.Add(int64(max))
	return s.inner.Fetch(ctx, max, deliver)
}

// memSource is an in-memory source of n ready messages shaped like those of
// sources.JetStream, with a no-op Acker: it isolates the lane's own cost
// from NATS.
type memSource struct {
	mu   sync.Mutex
	left int
	seq  uint64
	data []byte
}

func newMemSource(n int) *memSource {
	return &memSource{left: n, data: make([]byte, payloadSize)}
}

func (s *memSource) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	s.mu.Lock()
	k := min(max, s.left)
	s.left -= k
	first := s.seq
	s.seq += uint64(k)
	s.mu.Unlock()
	if k == 0 {
		// Nothing left: behave like a pull request that expires.
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		return nil
	}
	for i := range uint64(k) {
		seq := first + i + 1
		deliver(&shaper.Message{
			Subject:      strings.Clone("mem.jobs"),
			Header:       map[string][]string{shaper.MsgIDHeader: {"job-" + strconv.FormatUint(seq, 10)}},
			Data:         s.data,
			Stream:       "MEM",
			StreamSeq:    seq,
			NumDelivered: 1,
			Received:     time.Now(),
			Acker:        nopAcker{},
		})
	}
	return nil
}

type nopAcker struct{}

func (nopAcker) Ack(context.Context) error { return nil }
func (nopAcker) Nak(time.Duration) error   { return nil }
func (nopAcker) InProgress() error         { return nil }
func (nopAcker) Term(string) error         { return nil }
