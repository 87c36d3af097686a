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

// release frees a slot. The instant it stamps (unfull) is read here, not
// passed by the task: a task's end (Send's return) can come seconds before
// its slot is free (settle may publish a dead letter, up to ackTimeout),
// and readySince would take the work as ready that much too early.
func (s *semaphore) release() {
	s.mu.Lock()
	if s.n == s.limit { // all were taken: one is free from now
		s.unfull = time.Now()
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
