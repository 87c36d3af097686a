package sources

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// TestJetStreamConformance: the JetStream source keeps the contract of
// drain.Source and shaper.Acker (sources/sourcetest), on a real server.
func TestJetStreamConformance(t *testing.T) {
	sourcetest.Run(t, func(t *testing.T, ackWait time.Duration) sourcetest.Fixture {
		js := testJetStream(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		src, err := NewJetStream(ctx, js, JetStreamConfig{Stream: "CONFORM", Subjects: []string{"conform.>"},
			Durable: "shaper-conform", AckWait: ackWait, MaxAckPending: 100,
			RedeliverHeld: true}, nil) // the contract's ack-wait timing sees every redelivery (held.go)
		if err != nil {
			t.Fatal(err)
		}
		next := 0
		publish := func(t testing.TB, n int) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for range n {
				if _, err := js.Publish(ctx, "conform.jobs", fmt.Appendf(nil, "msg-%d", next)); err != nil {
					t.Fatal(err)
				}
				next++
			}
		}
		return sourcetest.Fixture{Source: src, Publish: publish}
	})
}
