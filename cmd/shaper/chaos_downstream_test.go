package main

// The chaos suite's downstream: an HTTP server that records every request
// and switches between the behaviours a scenario needs.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Downstream behaviours the tests switch between.
const (
	answerOK   int32 = iota // 204
	answerHang              // no response until the client gives up
	answer500               // 500 Internal Server Error
)

// request is one request the downstream saw.
type request struct {
	key      string    // Idempotency-Key
	bodyID   string    // the id in the payload: the message the request is about
	delivery int       // X-Shaper-Delivery: the server's delivery count
	at       time.Time // kernel receive timestamp of the request's first byte
	handled  time.Time // when the handler began (diagnostics only: late by scheduling)
	end      time.Time // when the handler answered, or saw the client go away
	status   int       // 0: no response (hung until the client went away)
}

// chaosDownstream records every request and answers as the test says:
// answerOK, answerHang or answer500 for everyone, except that reject(key)
// true answers 400 (a permanent failure: dead letter rejected_by_sink).
type chaosDownstream struct {
	srv     *httptest.Server // stamped (newStampedServer)
	answer  atomic.Int32
	latency time.Duration // before a 204
	reject  func(key string) bool
	active  atomic.Int64 // requests being answered now

	mu   sync.Mutex
	reqs []request
	ok   map[string]int // key -> 2xx answers
}

func newChaosDownstream(t *testing.T, latency time.Duration, reject func(string) bool) *chaosDownstream {
	t.Helper()
	d := &chaosDownstream{latency: latency, reject: reject, ok: map[string]int{}}
	d.srv = newStampedServer(t, d.serveHTTP)
	return d
}

func (d *chaosDownstream) url() string { return d.srv.URL + "/callback" }

func (d *chaosDownstream) serveHTTP(w http.ResponseWriter, r *http.Request, at time.Time) {
	d.active.Add(1)
	defer d.active.Add(-1)
	rq := request{at: at, handled: time.Now(), key: r.Header.Get("Idempotency-Key")}
	rq.delivery, _ = strconv.Atoi(r.Header.Get("X-Shaper-Delivery"))
	var body struct {
		ID string `json:"id"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	rq.bodyID = body.ID
	switch {
	case d.reject != nil && d.reject(rq.key):
		rq.status = http.StatusBadRequest
	case d.answer.Load() == answerHang:
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute): // never reached: the task timeout is shorter
		}
	case d.answer.Load() == answer500:
		rq.status = http.StatusInternalServerError
	default:
		if d.latency > 0 {
			time.Sleep(d.latency)
		}
		rq.status = http.StatusNoContent
	}
	rq.end = time.Now()
	d.mu.Lock()
	d.reqs = append(d.reqs, rq)
	if rq.status/100 == 2 {
		d.ok[rq.key]++
	}
	d.mu.Unlock()
	if rq.status != 0 {
		w.WriteHeader(rq.status)
	}
}

// requests returns the requests so far in arrival order.
func (d *chaosDownstream) requests() []request {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := slices.Clone(d.reqs)
	slices.SortStableFunc(r, func(x, y request) int { return x.at.Compare(y.at) })
	return r
}

// delivered returns how many distinct keys were answered 2xx.
func (d *chaosDownstream) delivered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ok)
}

// awaitDelivered waits until n distinct keys were answered 2xx and reports
// whether that happened within timeout.
func (d *chaosDownstream) awaitDelivered(n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for d.delivered() < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// attemptsByKey returns each key's requests in arrival order.
func attemptsByKey(reqs []request) map[string][]request {
	out := map[string][]request{}
	for _, r := range reqs {
		out[r.key] = append(out[r.key], r)
	}
	return out
}
