package sources

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/internal/testserver"
	"github.com/shaper-dev/shaper/shaper"
)

// TestFetchAcrossLeaderChange (issue 13): a pull pending on the consumer
// leader when it steps down is void: the server ends it with 409
// "Leadership Change" (nats.go reports ErrConsumerLeadershipChanged and
// does not re-issue it). The source re-issues it
// at once: the lane sees no failed fetch (which would back it off and
// make /readyz say "not bound"), and a job published right after the
// step-down reaches it within a fraction of FetchExpiry.
func TestFetchAcrossLeaderChange(t *testing.T) {
	if os.Getenv("SHAPERTEST_CLUSTER") != "1" {
		t.Skip("a 3-node nats-server cluster: set SHAPERTEST_CLUSTER=1 (.ci/run does)")
	}
	c := testserver.StartCluster(t, 3)
	nc, err := Connect(c.URLs(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, err := NewJetStream(ctx, js, JetStreamConfig{Stream: "LC", Subjects: []string{"lc.>"}, Durable: "lc",
		AckWait: 30 * time.Second, Limits: &StreamLimits{Replicas: 3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := js.Stream(ctx, "LC"); st.CachedInfo().Config.Replicas != 3 {
		t.Fatalf("stream replicas %d, want 3", st.CachedInfo().Config.Replicas)
	}

	var worst time.Duration
	var failures []string
	for round := range 3 {
		var mu sync.Mutex
		var got time.Time
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // the lane's fetch loop
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := src.Fetch(ctx, 1, func(m *shaper.Message) {
					mu.Lock()
					got = time.Now()
					mu.Unlock()
					_ = m.Acker.Ack(ctx)
				})
				if err != nil || !src.Bound() {
					// The lane would back off and /readyz say "not bound".
					mu.Lock()
					failures = append(failures, fmt.Sprintf("bound %v, err %v", src.Bound(), err))
					mu.Unlock()
				}
			}
		}()
		time.Sleep(300 * time.Millisecond) // a pull is pending on the leader
		resp, err := nc.Request("$JS.API.CONSUMER.LEADER.STEPDOWN.LC.lc", nil, 5*time.Second)
		if err != nil {
			t.Fatalf("step-down: %v", err)
		}
		t.Logf("step-down %d: %s", round, resp.Data)
		pubAt := time.Now()
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "lc.job", Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			g := got
			mu.Unlock()
			if !g.IsZero() {
				lat := g.Sub(pubAt)
				t.Logf("round %d: delivered %s after the publish", round, lat.Round(time.Millisecond))
				worst = max(worst, lat)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: not delivered 5 s after the publish", round)
			}
			time.Sleep(5 * time.Millisecond)
		}
		close(stop)
		<-done
	}
	if len(failures) > 0 {
		t.Errorf("a consumer leader change surfaced to the lane as a failed fetch: %v", failures)
	}
	if worst > 700*time.Millisecond {
		t.Errorf("a job published after a consumer leader change waited %s for a pull; want ≤ 700ms (the lost pull re-issued at once)", worst)
	}
}
