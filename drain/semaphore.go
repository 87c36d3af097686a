package drain

import (
	"context"
	"sync"
	"time"
)

// semaphore bounds the tasks running at once (task.max_in_flight, SPEC G5).
// Unlike a buffered channel its limit can change while tasks run (hot
// reload): a lower limit lets running tasks finish and admits no new one
// until the count is below it.
type semaphore struct {
	mu    sync.Mutex
	n     int
	limit int
	freed chan struct{}
	// unfull is when the last slot was freed after all were taken: since
	// then a slot has been free (until the next acquire fills them again).
	unfull time.Time
}

func newSemaphore(limit int) *semaphore {
	return &semaphore{limit: max(1, limit), freed: make(chan struct{}, 1)}
}

// acquire takes a slot, waiting for one; ok false when ctx ended first.
// It reports whether it waited, and when all slots were last full and
// one was freed (the zero time if never): a slot taken without waiting
// had been free since then at the latest, or since the caller's previous
// acquire (depart.go, readySince).
//
// A token on wake (nil: none) ends the wait without a slot: got false, ok
// true (an overtaken request at its gate, which the departure loop serves
// first: gate.go).
func (s *semaphore) acquire(ctx context.Context, wake <-chan struct{}) (unfull time.Time, waited, got, ok bool) {
	for {
		s.mu.Lock()
		if s.n < s.limit {
			s.n++
			unfull = s.unfull
			s.mu.Unlock()
			return unfull, waited, true, true
		}
		s.mu.Unlock()
		waited = true
		select {
		case <-s.freed:
		case <-wake:
			return time.Time{}, waited, false, true
		case <-ctx.Done():
			return time.Time{}, waited, false, false
		}
	}
}

// release frees a slot, now.
func (s *semaphore) release() { s.releaseAt(time.Time{}) }

// releaseAt frees a slot that its task freed at end (the zero time: now,
// read only when all slots were taken). A task passes the clock read that
// ended it (runTask), so that a lane at full speed, whose slots are all
// taken at most releases, reads the clock once less per message (issue
// 15, throughput).
func (s *semaphore) releaseAt(end time.Time) {
	s.mu.Lock()
	if s.n == s.limit { // all were taken: one is free from now
		if end.IsZero() {
			end = time.Now()
		}
		s.unfull = end
	}
	s.n--
	s.mu.Unlock()
	notify(s.freed)
}

func (s *semaphore) setLimit(limit int) {
	s.mu.Lock()
	if s.n >= s.limit && s.n < max(1, limit) {
		s.unfull = time.Now()
	}
	s.limit = max(1, limit)
	s.mu.Unlock()
	notify(s.freed)
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
