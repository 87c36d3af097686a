package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// TestTaskOutlivesAckWait: issue 13, "running tasks outlive AckWait" (SPEC
// G7) — two replicas (two daemons) read one durable consumer with
// ack_wait 4s; the downstream holds every call 10 s (task.timeout 15s). The
// running tasks keep their messages with in-progress acks, so the server
// never hands a message to the other replica while its call runs: each key
// reaches the downstream exactly once, and the consumer redelivered
// nothing. Each replica can hold every message (capacity and max_in_flight
// 8), so a message whose ack wait ran out would be taken by the other one.
func TestTaskOutlivesAckWait(t *testing.T) {
	const (
		n    = 6
		hold = 10 * time.Second
	)
	ns := testserver.NATS(t)
	js := connectJS(t, ns.ClientURL())

	var mu sync.Mutex
	calls := map[string]int{}
	done := map[string]bool{}
	srv := newStampedServer(t, func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		calls[key]++
		mu.Unlock()
		select {
		case <-time.After(hold):
		case <-r.Context().Done():
			return
		}
		mu.Lock()
		done[key] = true
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})

	var replicas []*testDaemon
	for range 2 {
		admin := freeAddr(t)
		td := startDaemon(t, fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
shutdown: { drain_timeout: 1s }
downstreams:
  payments:
    source: { stream: CALLBACKS, subjects: [callbacks.payments.>], ack_wait: 4s, max_deliver: 5 }
    bucket: { capacity: 8 }
    rate: { limit: 20/s }
    task: { timeout: 15s, max_in_flight: 8, retry: { backoff: [1s] } }
    sink: { kind: http, url: %q }
`, ns.ClientURL(), admin, srv.URL+"/callback"))
		waitReady(t, admin, 10*time.Second)
		replicas = append(replicas, td)
	}
	keys := publishBurst(t, js, "callbacks.payments.x", n)

	deadline := time.Now().Add(hold + 10*time.Second)
	for {
		mu.Lock()
		finished := len(done)
		mu.Unlock()
		if finished == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls finished within %s", finished, n, hold+10*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A redelivery the server made during the calls reaches the other
	// replica at once (it has room), so its call would be counted by now;
	// wait a little longer for one made at the very end.
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, "CALLBACKS", "shaper-payments")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, td := range replicas {
		td.stop(5 * time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keys {
		if calls[k] != 1 {
			t.Errorf("key %s: %d calls to the downstream, want exactly 1 (a task's message must not be redelivered while its call runs)", k, calls[k])
		}
	}
	if info.NumRedelivered != 0 || info.NumAckPending != 0 || info.NumPending != 0 {
		t.Errorf("consumer: NumRedelivered %d, NumAckPending %d, NumPending %d; want 0, 0, 0",
			info.NumRedelivered, info.NumAckPending, info.NumPending)
	}
	t.Logf("%d keys, calls %v, consumer redelivered %d", n, calls, info.NumRedelivered)
}
