package testserver

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStarters: each starter gives a server that answers.
func TestStarters(t *testing.T) {
	r := StartRedis(t)
	if got := r.Do("SET", "k", "v"); got != "+OK" {
		t.Errorf("SET = %q", got)
	}
	r.Kill()
	if Ping(r.Addr) == nil {
		t.Error("redis answers after Kill")
	}
	r.Start()
	if got := r.Do("GET", "k"); got != "$-1" {
		t.Errorf("GET after a restart without persistence = %q, want nil", got)
	}
	ns := NATS(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Errorf("JetStream: %v", err)
	}
}

// TestCluster: three processes form a JetStream cluster that takes an R3
// stream, and survives the kill of one node.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and starts three processes")
	}
	if os.Getenv("SHAPERTEST_CLUSTER") != "1" { // the cluster runs, .ci/run sets it
		t.Skip("a 3-node nats-server cluster (10 s): set SHAPERTEST_CLUSTER=1 (.ci/run does)")
	}
	c := StartCluster(t, 3)
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// 60 s: one CI run took more than 30 s for a new stream leader.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	leader := c.NodeByName(s.CachedInfo().Cluster.Leader)
	if leader == nil {
		t.Fatalf("stream leader %q is not a node", s.CachedInfo().Cluster.Leader)
	}
	c.Kill(leader)
	// Each publish gets a deadline of its own: one sent while the client
	// reconnects, or while the stream has no leader, gets no answer ever
	// (no leader stores it), and waiting for it with the whole deadline
	// was the failure seen in CI, not a slow election.
	var lastErr error
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, lastErr = js.Publish(pctx, "r3.x", []byte("after the kill"))
		pcancel()
		if lastErr == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no publish accepted within 60 s of the kill of the stream leader: %v", lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Restart(leader)
}

// TestNATSProcess: a stream survives a graceful stop and a restart on the
// same port and store.
func TestNATSProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and starts a process")
	}
	p := StartNATSProcess(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func() jetstream.JetStream {
		t.Helper()
		nc, err := nats.Connect(p.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return js
	}
	js := connect()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "keep.x", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	p.Stop(syscall.SIGTERM)
	p.Start()
	st, err := connect().Stream(ctx, "KEEP")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("stream has %d messages after the restart, want 1", n)
	}
}

// TestSentinelFailover: a primary, a replica of it and a sentinel;
// SENTINEL FAILOVER makes the replica the master the sentinel names.
func TestSentinelFailover(t *testing.T) {
	primary := StartRedis(t, WithRedisArgs("--repl-diskless-sync-delay", "0"))
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica := StartRedis(t, WithRedisArgs("--replicaof", host, port))
	awaitReplicaSynced(t, replica)
	s := StartSentinel(t, "shaper", primary.Addr, 500*time.Millisecond)
	// The sentinel learns the replica from the primary's INFO.
	deadline := time.Now().Add(20 * time.Second)
	for !s.KnowsReplica("shaper", replica.Addr) {
		if time.Now().After(deadline) {
			t.Fatal("the sentinel did not learn the replica")
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.Failover("shaper")
	deadline = time.Now().Add(10 * time.Second)
	for s.Master("shaper") != replica.Addr {
		if time.Now().After(deadline) {
			t.Fatalf("after SENTINEL FAILOVER the master is %q, want %s", s.Master("shaper"), replica.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitReplicaSynced waits until r reports its link to the master up.
func awaitReplicaSynced(t *testing.T, r *Redis) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(strings.Join(do(t, r.Addr, "INFO", "replication"), " "), "master_link_status:up") {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not sync with its master")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
