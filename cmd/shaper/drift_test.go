package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/daemon"
	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/internal/testserver"
)

// TestConsumerDrift is case C36 with its numbers: the durable consumer on
// the server follows the config across restarts (ack_wait, max_deliver,
// subjects), and a renamed source.consumer does not re-send the stream's
// history.
func TestConsumerDrift(t *testing.T) {
	ns := testserver.NATS(t)
	url := ns.ClientURL()
	js := connectJS(t, url)

	var mu sync.Mutex
	count := map[string]int{}
	srv := newStampedServer(t, func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		count[key]++
		mu.Unlock()
		if key == "e9" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	seen := func(key string) int {
		mu.Lock()
		defer mu.Unlock()
		return count[key]
	}
	total := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range count {
			n += c
		}
		return n
	}
	publish := func(subject string, keys ...string) {
		t.Helper()
		for _, k := range keys {
			msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte(k)}
			msg.Header.Set(jetstream.MsgIDHeader, k)
			if _, err := js.PublishMsg(context.Background(), msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	awaitKeys := func(what string, keys []string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for _, k := range keys {
			for seen(k) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%s: %s not delivered within %s", what, k, timeout)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	keysOf := func(prefix string, n int) []string {
		var k []string
		for i := range n {
			k = append(k, fmt.Sprintf("%s-%02d", prefix, i))
		}
		return k
	}
	admin := freeAddr(t)
	run := func(source, task string) *testDaemon {
		t.Helper()
		td := startDaemon(t, fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
downstreams:
  payments:
    source: %s
    rate: { limit: 50/s }
    task: %s
    sink: { kind: http, url: %q }
`, url, admin, source, task, srv.URL+"/callback"))
		waitReady(t, admin, 10*time.Second)
		return td
	}
	consumerConfig := func(name string) jetstream.ConsumerConfig {
		t.Helper()
		c, err := js.Consumer(context.Background(), "CALLBACKS", name)
		if err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		return c.CachedInfo().Config
	}

	// Run 1: ack_wait 60s, max_deliver 5; 10 messages delivered.
	td := run("{stream: CALLBACKS, subjects: [callbacks.payments.>], ack_wait: 60s, max_deliver: 5}", "{timeout: 2s}")
	run1 := keysOf("r1", 10)
	publish("callbacks.payments.x", run1...)
	awaitKeys("run 1", run1, 5*time.Second)
	td.stop(5 * time.Second)

	// Run 2: ack_wait 20s, max_deliver 3, backoff [1s]; e9 fails.
	ready := time.Now()
	td = run("{stream: CALLBACKS, subjects: [callbacks.payments.>], ack_wait: 20s, max_deliver: 3}", "{timeout: 2s, retry: {backoff: [1s]}}")
	if cc := consumerConfig("shaper-payments"); cc.AckWait != 20*time.Second || cc.MaxDeliver != -1 {
		// MaxDeliver on the server is -1 by design: the lane counts
		// source.max_deliver itself and dead-letters (sources.JetStream).
		t.Errorf("run 2: consumer AckWait %s, MaxDeliver %d %s after ready; want 20s, -1 (the lane counts max_deliver 3)",
			cc.AckWait, cc.MaxDeliver, time.Since(ready).Round(time.Millisecond))
	}
	run2 := append(keysOf("r2", 9), "e9")
	publish("callbacks.payments.x", run2...)
	awaitKeys("run 2", run2[:9], 5*time.Second)
	deadline := time.Now().Add(8 * time.Second)
	var dead *jetstream.RawStreamMsg
	for dead == nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if s, err := js.Stream(context.Background(), daemon.DeadStream); err == nil {
			dead, _ = s.GetLastMsgForSubject(context.Background(), "shaper.dead.payments")
		}
	}
	if dead == nil {
		t.Fatalf("run 2: e9 not dead-lettered within 8 s (%d attempts)", seen("e9"))
	}
	if seen("e9") != 3 || dead.Header.Get("Shaper-Reason") != "max_deliver" || dead.Header.Get("Shaper-Attempts") != "3" {
		t.Errorf("run 2: e9 got %d attempts, dead letter reason %q attempts %q; want 3, max_deliver, 3",
			seen("e9"), dead.Header.Get("Shaper-Reason"), dead.Header.Get("Shaper-Attempts"))
	}
	for _, k := range run1 {
		if seen(k) != 1 {
			t.Errorf("run 2: run-1 message %s sent %d times", k, seen(k))
		}
	}
	td.stop(5 * time.Second)

	// Run 3: a subject added; the stream and the consumer take it.
	td = run("{stream: CALLBACKS, subjects: [callbacks.payments.>, callbacks.refunds.>], ack_wait: 20s, max_deliver: 3}", "{timeout: 2s, retry: {backoff: [1s]}}")
	if cc := consumerConfig("shaper-payments"); len(cc.FilterSubjects) != 2 {
		t.Errorf("run 3: consumer filters %q %q; want both subjects", cc.FilterSubject, cc.FilterSubjects)
	}
	run3 := keysOf("refund", 5)
	publish("callbacks.refunds.x", run3...)
	awaitKeys("run 3", run3, 2*time.Second)
	td.stop(5 * time.Second)

	// Run 4: source.consumer renamed; the stream (limits retention) holds
	// the 25 messages delivered before. None is sent again.
	before := total()
	td = run("{stream: CALLBACKS, subjects: [callbacks.payments.>, callbacks.refunds.>], consumer: shaper-payments-v2, ack_wait: 20s, max_deliver: 3}",
		"{timeout: 2s, retry: {backoff: [1s]}}")
	time.Sleep(5 * time.Second)
	if got := total() - before; got != 0 {
		t.Errorf("run 4: the renamed consumer re-sent %d old messages to the downstream; want 0", got)
	}
	logs := td.logs.String()
	if !strings.Contains(logs, "old_consumer=shaper-payments") || !strings.Contains(logs, "new_consumer=shaper-payments-v2") {
		t.Errorf("run 4: no warning naming the consumer left behind and the new one:\n%s", logs)
	}
	// It still delivers what comes next.
	publish("callbacks.payments.x", "after-rename")
	awaitKeys("run 4", []string{"after-rename"}, 2*time.Second)
	td.stop(5 * time.Second)
}

// TestConsumerDriftRefused: a durable consumer that the server cannot
// update to the config (here its ack policy, which the server never
// changes) fails the start with an error naming the consumer, the stream
// and what to do, never a silently kept consumer.
func TestConsumerDriftRefused(t *testing.T) {
	ns := testserver.NATS(t)
	js := connectJS(t, ns.ClientURL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CALLBACKS", Subjects: []string{"callbacks.payments.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "CALLBACKS", jetstream.ConsumerConfig{Durable: "shaper-payments",
		AckPolicy: jetstream.AckNonePolicy, FilterSubject: "callbacks.payments.>"}); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load(writeFile(t, "config.yaml", fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
downstreams:
  payments:
    source: { stream: CALLBACKS, subjects: [callbacks.payments.>] }
    rate: { limit: 50/s }
    sink: { kind: log }
`, ns.ClientURL(), freeAddr(t))), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = startLoaded(t, cfg)
	if err == nil || !strings.Contains(err.Error(), `consumer "shaper-payments" on stream "CALLBACKS"`) ||
		!strings.Contains(err.Error(), "refuses to update") {
		t.Fatalf("start with a consumer the server cannot update: %v; want an error naming it", err)
	}
	t.Logf("start refused: %v", err)
}
