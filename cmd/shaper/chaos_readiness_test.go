package main

// The chaos suite's readiness watch: /readyz polled in the background.

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// readiness polls /readyz every 20 ms in the background and records each
// change of its answer.
type readiness struct {
	mu      sync.Mutex
	changes []readyChange
	stop    chan struct{}
	done    chan struct{}
}

type readyChange struct {
	at    time.Time
	ready bool
	body  string
}

func watchReadiness(t *testing.T, admin string) *readiness {
	rd := &readiness{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(rd.done)
		for {
			code, body, err := httpGet("http://" + admin + "/readyz")
			ready := err == nil && code == http.StatusOK
			rd.mu.Lock()
			if n := len(rd.changes); n == 0 || rd.changes[n-1].ready != ready {
				if err != nil {
					body = err.Error()
				}
				rd.changes = append(rd.changes, readyChange{at: time.Now(), ready: ready, body: strings.TrimSpace(body)})
			}
			rd.mu.Unlock()
			select {
			case <-rd.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(rd.close)
	return rd
}

func (rd *readiness) close() {
	select {
	case <-rd.stop:
	default:
		close(rd.stop)
	}
	<-rd.done
}

// firstChange returns the first recorded change to ready at or after from.
func (rd *readiness) firstChange(from time.Time, ready bool) (readyChange, bool) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, c := range rd.changes {
		if c.ready == ready && !c.at.Before(from) {
			return c, true
		}
	}
	return readyChange{}, false
}

// awaitChange waits up to timeout for a change to ready at or after from.
func (rd *readiness) awaitChange(from time.Time, ready bool, timeout time.Duration) (readyChange, bool) {
	deadline := time.Now().Add(timeout)
	for {
		if c, ok := rd.firstChange(from, ready); ok {
			return c, true
		}
		if time.Now().After(deadline) {
			return readyChange{}, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
