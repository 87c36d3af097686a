package drain

import (
	"context"
	"sync"
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
}

func newSemaphore(limit int) *semaphore {
	return &semaphore{limit: max(1, limit), freed: make(chan struct{}, 1)}
}

// acquire takes a slot, waiting for one; false when ctx ended first.
func (s *semaphore) acquire(ctx context.Context) bool {
	for {
		s.mu.Lock()
		if s.n < s.limit {
			s.n++
			s.mu.Unlock()
			return true
		}
		s.mu.Unlock()
		select {
		case <-s.freed:
		case <-ctx.Done():
			return false
		}
	}
}

func (s *semaphore) release() {
	s.mu.Lock()
	s.n--
	s.mu.Unlock()
	notify(s.freed)
}

func (s *semaphore) setLimit(limit int) {
	s.mu.Lock()
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
