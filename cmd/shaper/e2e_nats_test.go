package main

// The end-to-end tests' NATS client: connect, publish, wait until a
// consumer settled.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// connectJS connects to the NATS server at url; a cleanup closes the
// connection.
func connectJS(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// msgKey is the Nats-Msg-Id (and so the Idempotency-Key) of job i.
func msgKey(i int) string { return fmt.Sprintf("msg-%04d", i) }

// publishBurst publishes n jobs to subject at once, as fast as the server
// takes them, with Nats-Msg-Id msg-0000… and the sequence in the payload,
// and waits for every publish ack. It returns the keys in publish order.
func publishBurst(t *testing.T, js jetstream.JetStream, subject string, n int) []string {
	t.Helper()
	keys := make([]string, 0, n)
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: fmt.Appendf(nil, `{"seq":%d}`, i)}
		msg.Header.Set(jetstream.MsgIDHeader, msgKey(i))
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		futures = append(futures, f)
		keys = append(keys, msgKey(i))
	}
	timeout := time.After(10 * time.Second)
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("publish %d: %v", i, err)
		case <-timeout:
			t.Fatalf("publish acks: timed out at %d of %d", i, n)
		}
	}
	return keys
}

// waitConsumerSettled polls the consumer until nothing is pending or
// unacknowledged (acks are fire-and-forget), or fails after timeout.
func waitConsumerSettled(t *testing.T, js jetstream.JetStream, stream, consumer string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := js.Consumer(ctx, stream, consumer)
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = c.Info(ctx)
		}
		cancel()
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("NumPending %d, NumAckPending %d, NumRedelivered %d",
				info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		if time.Now().After(deadline) {
			t.Errorf("consumer %s/%s not settled after %s: %s", stream, consumer, timeout, last)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
