package sources

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/shaper"
)

// standbyReplica is one replica of a standby lane: its own connection and
// source, fetching one message at a time (acked at once) until stopped.
type standbyReplica struct {
	src  *JetStream
	got  atomic.Int64
	last atomic.Int64 // unix ns of the last message received
	stop chan struct{}
	done chan struct{}
	// hold makes the replica stop fetching (a full bucket) while it keeps
	// its pin with KeepPin.
	hold atomic.Bool
}

func startStandbyReplica(t *testing.T, url string, cfg JetStreamConfig) *standbyReplica {
	t.Helper()
	nc, err := Connect(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewJetStream(context.Background(), js, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &standbyReplica{src: src, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer nc.Close()
		keep := time.NewTicker(KeepPinEvery)
		defer keep.Stop()
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			if r.hold.Load() {
				select {
				case <-r.stop:
					return
				case <-keep.C:
					_ = src.KeepPin(context.Background())
				}
				continue
			}
			_ = src.Fetch(context.Background(), 1, func(m *shaper.Message) {
				r.got.Add(1)
				r.last.Store(time.Now().UnixNano())
				_ = m.Acker.Ack(context.Background())
			})
		}
	}()
	t.Cleanup(r.kill)
	return r
}

// kill stops the replica's pulls at once (its connection closes), as a
// kill -9 would.
func (r *standbyReplica) kill() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// TestStandbyOneActiveAndTakeover: three replicas of a standby lane; only
// one receives messages (the others' pulls get nothing); it keeps the pin
// with KeepPin while it fetches nothing for longer than the pinned TTL;
// when it dies another one takes over within StandbyTakeover.
func TestStandbyOneActiveAndTakeover(t *testing.T) {
	js := testJetStream(t)
	url := js.Conn().ConnectedUrl()
	cfg := JetStreamConfig{Stream: "SB", Subjects: []string{"sb.>"}, Durable: "shaper-sb",
		AckWait: 30 * time.Second, Standby: true}
	rs := make([]*standbyReplica, 3)
	for i := range rs {
		rs[i] = startStandbyReplica(t, url, cfg)
	}
	ctx := context.Background()
	var pubMu sync.Mutex
	n := 0
	publish := func(k int) {
		pubMu.Lock()
		defer pubMu.Unlock()
		for range k {
			n++
			if _, err := js.Publish(ctx, fmt.Sprintf("sb.%d", n), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	active := func() (int, []int64) {
		counts := make([]int64, len(rs))
		idx := -1
		for i, r := range rs {
			counts[i] = r.got.Load()
			if counts[i] > 0 && r.src.Active() {
				idx = i
			}
		}
		return idx, counts
	}
	publish(20)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, c := active(); c[0]+c[1]+c[2] == 20 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	a, counts := active()
	if a < 0 || counts[a] != 20 {
		t.Fatalf("want one active replica with all 20 messages, got counts %v (active %d)", counts, a)
	}
	// The active one stops fetching (full bucket) for twice the TTL but
	// keeps its pin: nobody else receives what is published meanwhile.
	rs[a].hold.Store(true)
	publish(5)
	time.Sleep(2 * StandbyPinnedTTL)
	if _, c := active(); c[0]+c[1]+c[2] != c[a] { // its pull in flight may have taken one
		t.Fatalf("a standby replica received messages while the active one kept its pin: counts %v", c)
	}
	rs[a].hold.Store(false)
	deadline = time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && rs[a].got.Load() < 25 {
		time.Sleep(20 * time.Millisecond)
	}
	if got := rs[a].got.Load(); got != 25 {
		t.Fatalf("the active replica got %d after resuming, want 25", got)
	}
	// Kill the active one: another takes over within StandbyTakeover.
	killed := time.Now()
	rs[a].kill()
	publish(10)
	var taken time.Duration
	for time.Since(killed) < 3*StandbyTakeover {
		_, c := active()
		if c[0]+c[1]+c[2] == 35 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, c := active()
	first := time.Time{}
	for i, r := range rs {
		if i != a && r.got.Load() > 0 {
			at := time.Unix(0, r.last.Load())
			if first.IsZero() || at.Before(first) {
				first = at
			}
			if r.got.Load() != 10 {
				t.Errorf("replica %d got %d after the takeover, want all 10 (counts %v)", i, r.got.Load(), c)
			}
		}
	}
	if first.IsZero() {
		t.Fatalf("no replica took over within %v: counts %v", 3*StandbyTakeover, c)
	}
	taken = first.Sub(killed)
	t.Logf("takeover after %v (StandbyTakeover %v)", taken.Round(time.Millisecond), StandbyTakeover)
	if taken > StandbyTakeover {
		t.Errorf("takeover took %v, more than StandbyTakeover %v", taken, StandbyTakeover)
	}
}

// TestStandbyOnExistingConsumer: turning source.standby on for a lane
// whose durable consumer exists (created without it) updates the consumer
// to the pinned-client policy, and turning it off again removes it.
func TestStandbyOnExistingConsumer(t *testing.T) {
	js := testJetStream(t)
	ctx := context.Background()
	cfg := JetStreamConfig{Stream: "SB2", Subjects: []string{"sb2.>"}, Durable: "shaper-sb2", AckWait: 30 * time.Second}
	if _, err := NewJetStream(ctx, js, cfg, nil); err != nil {
		t.Fatal(err)
	}
	for _, standby := range []bool{true, false} {
		cfg.Standby = standby
		if _, err := NewJetStream(ctx, js, cfg, nil); err != nil {
			t.Fatalf("standby %v on the existing consumer: %v", standby, err)
		}
		c, err := js.Consumer(ctx, "SB2", "shaper-sb2")
		if err != nil {
			t.Fatal(err)
		}
		got := c.CachedInfo().Config
		pinned := got.PriorityPolicy == jetstream.PriorityPolicyPinned
		if pinned != standby {
			t.Errorf("standby %v: consumer priority policy %v, groups %v", standby, got.PriorityPolicy, got.PriorityGroups)
		}
		if standby && (got.PinnedTTL != StandbyPinnedTTL || len(got.PriorityGroups) != 1 || got.PriorityGroups[0] != StandbyGroup) {
			t.Errorf("standby consumer: PinnedTTL %v, groups %v", got.PinnedTTL, got.PriorityGroups)
		}
	}
}

// TestStandbyKept: a standby lane fails when the server answered with a
// consumer without the pinned-client policy (a server before 2.11); other
// lanes do not care.
func TestStandbyKept(t *testing.T) {
	pinned := jetstream.ConsumerConfig{PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{StandbyGroup}}
	for _, tc := range []struct {
		standby bool
		got     jetstream.ConsumerConfig
		fail    bool
	}{
		{standby: true, got: pinned},
		{standby: true, got: jetstream.ConsumerConfig{}, fail: true},
		{standby: true, got: jetstream.ConsumerConfig{PriorityPolicy: jetstream.PriorityPolicyPinned}, fail: true},
		{standby: true, got: jetstream.ConsumerConfig{PriorityGroups: []string{StandbyGroup}}, fail: true},
		{standby: false, got: jetstream.ConsumerConfig{}},
	} {
		s := &JetStream{cfg: JetStreamConfig{Standby: tc.standby, Durable: "d", Stream: "S"}}
		err := s.standbyKept(tc.got)
		if (err != nil) != tc.fail || (err != nil && !errors.Is(err, ErrStandbyUnsupported)) {
			t.Errorf("standby %v, server config %+v: err %v, want failure %v", tc.standby, tc.got, err, tc.fail)
		}
	}
}
