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
// step-down reaches it within a fraction of FetchExpiry, counted from
// the later of the publish and the new leader's election (its advisory:
// the step-down's answer comes first, and one CI run's election took over a
// second). A pull the new leader did not know of gets no 409; the source
// voids it itself on the leader-elected advisory (leaderwatch.go), and
// rounds 3–5 check that path with the 409 silenced.
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

	// The server names the new leader in an advisory: the test's clock starts
	// at the later of it and the publish (a step-down's answer comes before
	// the election ends, which took over a second once in CI).
	elected := make(chan time.Time, 16)
	asub, err := nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.LC.lc", func(*nats.Msg) {
		elected <- time.Now()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer asub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	for len(elected) > 0 { // the consumer's first election
		<-elected
	}

	// Rounds 0–2: the new leader ends the old leader's pull with a 409.
	// Rounds 3–5: the source is made deaf to that 409 (silence409), as
	// when the new leader did not know of the pull (leaderwatch.go): the
	// leader-elected advisory must void and re-issue it within leaderGrace.
	var worst, worstSilent time.Duration
	var failures []string
	defer silence409.Store(false)
	for round := range 6 {
		silent := round >= 3
		silence409.Store(silent)
		repulls0 := src.leaderRepulls.Load()
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
		if silent {
			// A pull open 150–300 ms when the leader steps down: without
			// the advisory it would be answered at its expiry, 700–850 ms
			// after the step-down.
			for {
				src.lw.mu.Lock()
				open, age := src.lw.pull != 0, time.Since(src.lw.started)
				src.lw.mu.Unlock()
				if open && age >= 150*time.Millisecond && age < 300*time.Millisecond {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		for len(elected) > 0 {
			<-elected
		}
		resp, err := nc.Request("$JS.API.CONSUMER.LEADER.STEPDOWN.LC.lc", nil, 5*time.Second)
		if err != nil {
			t.Fatalf("step-down: %v", err)
		}
		t.Logf("step-down %d: %s", round, resp.Data)
		pubAt := time.Now()
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "lc.job", Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		var electedAt time.Time
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			g := got
			mu.Unlock()
			select {
			case at := <-elected:
				electedAt = at
			default:
			}
			if !g.IsZero() {
				if electedAt.IsZero() {
					select {
					case electedAt = <-elected:
					case <-time.After(time.Second):
						t.Fatalf("round %d: no leader-elected advisory", round)
					}
				}
				from := pubAt
				if electedAt.After(from) {
					from = electedAt
				}
				lat := g.Sub(from)
				t.Logf("round %d: leader elected %s after the step-down's answer; delivered %s after the publish, %s after the later of the two; %d pulls re-issued on a 409",
					round, electedAt.Sub(pubAt).Round(time.Millisecond), g.Sub(pubAt).Round(time.Millisecond), lat.Round(time.Millisecond), src.leaderRepulls.Load()-repulls0)
				if silent {
					worstSilent = max(worstSilent, lat)
				} else {
					worst = max(worst, lat)
				}
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
	if worstSilent > leaderGrace+200*time.Millisecond {
		t.Errorf("with no 409, a job published after a consumer leader change waited %s after the election; want ≤ %s (the advisory voids the pull after leaderGrace %s)",
			worstSilent, leaderGrace+200*time.Millisecond, leaderGrace)
	}
	if worst > 700*time.Millisecond {
		t.Errorf("a job published after a consumer leader change waited %s for a pull; want ≤ 700ms (the lost pull re-issued at once)", worst)
	}
}
