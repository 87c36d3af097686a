package testserver

import (
	"testing"
	"time"
)

// TestRedisCluster: three masters with a replica each form a cluster; a
// manual failover moves a key's slot to the replica, a kill -9 of that
// master promotes the other node again, and the killed node rejoins as a
// replica when started again.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six redis-server processes")
	}
	c := StartRedisCluster(t, 3, 1)
	if got := len(c.Masters()); got != 3 {
		t.Fatalf("%d masters, want 3", got)
	}
	const key = "{shaper:chaos}:schedule"
	m := c.MasterFor(key)
	r := c.ReplicaOf(m)
	began := time.Now()
	c.Failover(r)
	if got := c.MasterFor(key); got != r {
		t.Fatalf("after CLUSTER FAILOVER on %s the master of %s is %s", r.Addr, key, got.Addr)
	}
	t.Logf("CLUSTER FAILOVER: %v", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	r.Kill()
	if got := c.AwaitMasterFor(key, r, 10*time.Second); got != m {
		t.Fatalf("after kill -9 of %s the master of %s is %s, want %s", r.Addr, key, got.Addr, m.Addr)
	}
	t.Logf("kill -9 of the master: its replica promoted after %v", time.Since(began).Round(time.Millisecond))
	r.Start()
	c.AwaitOK(10 * time.Second)
	c.AwaitReplica(r, m, 10*time.Second)
}
