package testserver

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisCluster is a real Redis Cluster on loopback: redis-server processes
// with cluster-enabled yes, formed by `redis-cli --cluster create`, with a
// short cluster-node-timeout so that a killed master's replica is promoted
// within about a second. Nodes keep their nodes.conf across Kill and Start
// (no data: persistence is off), so a restarted node rejoins the cluster,
// empty, as a replica of whoever took its slots.
type RedisCluster struct {
	// Nodes are the servers, masters first as created (roles change with
	// failovers: ask MasterFor and ReplicaOf).
	Nodes []*Redis

	t testing.TB
}

// ClusterNodeTimeout is the cluster-node-timeout of StartRedisCluster's
// nodes: a master that does not answer for this long is failed over.
const ClusterNodeTimeout = 500 * time.Millisecond

// StartRedisCluster starts masters × (1 + replicasPer) redis-server
// processes, forms a cluster of them (every master with replicasPer
// replicas) and waits until every node reports cluster_state:ok. Each node
// is killed at the end of the test.
func StartRedisCluster(t testing.TB, masters, replicasPer int) *RedisCluster {
	t.Helper()
	cli := need(t, "redis-cli")
	c := &RedisCluster{t: t}
	var addrs []string
	for range masters * (1 + replicasPer) {
		r := StartRedis(t, WithRedisArgs("--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(ClusterNodeTimeout.Milliseconds(), 10),
			// The bus port is port+10000 by default, which may be above
			// 65535 for a free port from the ephemeral range.
			"--cluster-port", strconv.Itoa(FreePort(t)),
			"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
			"--cluster-replica-validity-factor", "0"))
		c.Nodes = append(c.Nodes, r)
		addrs = append(addrs, r.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPer), "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.AwaitOK(20 * time.Second)
	return c
}

// Seeds is every node's address, comma-separated (redis.addr of a cluster).
func (c *RedisCluster) Seeds() string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.Addr)
	}
	return strings.Join(a, ",")
}

// node returns the node at addr.
func (c *RedisCluster) node(addr string) *Redis {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	c.t.Fatalf("no cluster node %s", addr)
	return nil
}

// client runs f with a plain client of the node at addr (no cluster
// routing), bounded by a second.
func client(addr string, f func(ctx context.Context, rc *redis.Client) error) error {
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 300 * time.Millisecond,
		DisableIdentity: true, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return f(ctx, rc)
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, master string // master: the master's id of a replica, "-" for a master
	flags            []string
	slots            [][2]int // slot ranges a master serves
}

func (n clusterNode) is(flag string) bool {
	for _, f := range n.flags {
		if f == flag {
			return true
		}
	}
	return false
}

// nodesSeenBy reads CLUSTER NODES from the node at addr.
func nodesSeenBy(addr string) ([]clusterNode, error) {
	var text string
	err := client(addr, func(ctx context.Context, rc *redis.Client) (err error) {
		text, err = rc.ClusterNodes(ctx).Result()
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		hostport, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{id: f[0], addr: hostport, flags: strings.Split(f[2], ","), master: f[3]}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") { // a slot being migrated
				continue
			}
			lo, hi, found := strings.Cut(s, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if found {
				b, _ = strconv.Atoi(hi)
			}
			n.slots = append(n.slots, [2]int{a, b})
		}
		out = append(out, n)
	}
	return out, nil
}

// Slot is the cluster hash slot of key (CLUSTER KEYSLOT).
func (c *RedisCluster) Slot(key string) int {
	c.t.Helper()
	for _, n := range c.Nodes {
		var slot int64
		if err := client(n.Addr, func(ctx context.Context, rc *redis.Client) (err error) {
			slot, err = rc.ClusterKeySlot(ctx, key).Result()
			return err
		}); err == nil {
			return int(slot)
		}
	}
	c.t.Fatalf("no cluster node answers CLUSTER KEYSLOT")
	return 0
}

// masterOf returns the master serving slot and its live replicas, as every
// live node sees them; an error when some node names none that is not
// failed, or the nodes do not agree yet (gossip still under way).
func (c *RedisCluster) masterOf(slot int) (master clusterNode, replicas []clusterNode, err error) {
	found := false
	for _, n := range c.Nodes {
		if Ping(n.Addr) != nil {
			continue
		}
		nodes, e := nodesSeenBy(n.Addr)
		if e != nil {
			return clusterNode{}, nil, e
		}
		m, ok := servingMaster(nodes, slot)
		if !ok {
			return clusterNode{}, nil, fmt.Errorf("node %s names no live master for slot %d", n.Addr, slot)
		}
		if found && m.addr != master.addr {
			return clusterNode{}, nil, fmt.Errorf("nodes disagree on the master of slot %d: %s and %s", slot, master.addr, m.addr)
		}
		if !found {
			master, found = m, true
			for _, x := range nodes {
				if x.master == m.id && !x.is("fail") && !x.is("fail?") {
					replicas = append(replicas, x)
				}
			}
		}
	}
	if !found {
		return clusterNode{}, nil, fmt.Errorf("no live node answers CLUSTER NODES")
	}
	return master, replicas, nil
}

// servingMaster finds the master of slot among nodes that is not failed.
func servingMaster(nodes []clusterNode, slot int) (clusterNode, bool) {
	for _, m := range nodes {
		if !m.is("master") || m.is("fail") || m.is("fail?") {
			continue
		}
		for _, r := range m.slots {
			if slot >= r[0] && slot <= r[1] {
				return m, true
			}
		}
	}
	return clusterNode{}, false
}

// MasterFor returns the node that is the master of key's slot now.
func (c *RedisCluster) MasterFor(key string) *Redis {
	c.t.Helper()
	slot := c.Slot(key)
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, _, err := c.masterOf(slot)
		if err == nil {
			return c.node(m.addr)
		}
		if time.Now().After(deadline) {
			c.t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ReplicaOf returns a live replica of master.
func (c *RedisCluster) ReplicaOf(master *Redis) *Redis {
	c.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if rs := c.replicasOf(master); len(rs) > 0 {
			return rs[0]
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("master %s has no live replica", master.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replicasOf returns the live replicas of master as master sees them.
func (c *RedisCluster) replicasOf(master *Redis) []*Redis {
	nodes, err := nodesSeenBy(master.Addr)
	if err != nil {
		return nil
	}
	var id string
	for _, n := range nodes {
		if n.is("myself") {
			id = n.id
		}
	}
	var out []*Redis
	for _, n := range nodes {
		if n.master == id && !n.is("fail") && !n.is("fail?") && Ping(n.addr) == nil {
			out = append(out, c.node(n.addr))
		}
	}
	return out
}

// AwaitReplica waits until n is a replica of master (a restarted node
// rejoining).
func (c *RedisCluster) AwaitReplica(n, master *Redis, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for c.isMaster(n) || !slices.Contains(c.replicasOf(master), n) {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s did not become a replica of %s within %s", n.Addr, master.Addr, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Masters returns the nodes that are masters now (that serve slots).
func (c *RedisCluster) Masters() []*Redis {
	c.t.Helper()
	var out []*Redis
	for _, n := range c.Nodes {
		if Ping(n.Addr) != nil {
			continue
		}
		nodes, err := nodesSeenBy(n.Addr)
		if err != nil {
			continue
		}
		for _, m := range nodes {
			if m.is("myself") && m.is("master") && len(m.slots) > 0 {
				out = append(out, n)
			}
		}
	}
	return out
}

// Failover makes replica take over its master's slots with a manual
// failover (CLUSTER FAILOVER: the master stops writes, the replica catches
// up and is promoted; no write is lost) and waits until the cluster is ok
// with replica as master.
func (c *RedisCluster) Failover(replica *Redis) {
	c.t.Helper()
	if err := client(replica.Addr, func(ctx context.Context, rc *redis.Client) error {
		return rc.ClusterFailover(ctx).Err()
	}); err != nil {
		c.t.Fatalf("CLUSTER FAILOVER on %s: %v", replica.Addr, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !c.isMaster(replica) || !c.allSee(replica) {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s is not master 10 s after CLUSTER FAILOVER", replica.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.AwaitOK(10 * time.Second)
}

// allSee reports whether every live node names n as a master of slots.
func (c *RedisCluster) allSee(n *Redis) bool {
	for _, x := range c.Nodes {
		if Ping(x.Addr) != nil {
			continue
		}
		nodes, err := nodesSeenBy(x.Addr)
		if err != nil {
			return false
		}
		ok := false
		for _, m := range nodes {
			ok = ok || (m.addr == n.Addr && m.is("master") && !m.is("fail") && !m.is("fail?") && len(m.slots) > 0)
		}
		if !ok {
			return false
		}
	}
	return true
}

func (c *RedisCluster) isMaster(n *Redis) bool {
	var role []any
	err := client(n.Addr, func(ctx context.Context, rc *redis.Client) (err error) {
		role, err = rc.Do(ctx, "ROLE").Slice()
		return err
	})
	return err == nil && len(role) > 0 && role[0] == "master"
}

// AwaitMasterFor waits until a live node other than old is the master of
// key's slot and the cluster is ok (after old was killed: its replica's
// promotion), and returns the new master.
func (c *RedisCluster) AwaitMasterFor(key string, old *Redis, timeout time.Duration) *Redis {
	c.t.Helper()
	slot := c.Slot(key)
	deadline := time.Now().Add(timeout)
	for {
		m, _, err := c.masterOf(slot)
		if err == nil && m.addr != old.Addr && Ping(m.addr) == nil && c.isMaster(c.node(m.addr)) {
			c.AwaitOK(timeout)
			return c.node(m.addr)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no new master for slot %d within %s (last: %v %v)", slot, timeout, m.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AwaitOK waits until every live node reports cluster_state:ok.
func (c *RedisCluster) AwaitOK(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var bad string
		for _, n := range c.Nodes {
			if Ping(n.Addr) != nil {
				continue
			}
			var info string
			err := client(n.Addr, func(ctx context.Context, rc *redis.Client) (err error) {
				info, err = rc.ClusterInfo(ctx).Result()
				return err
			})
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				bad = n.Addr
				break
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redis cluster node %s not ok after %s", bad, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CommandStats returns the calls and failed calls of cmd (lower case, e.g.
// "evalsha") on the node n since its start or CONFIG RESETSTAT (INFO
// commandstats).
func CommandStats(t testing.TB, n *Redis, cmd string) (calls, failed int) {
	t.Helper()
	var info string
	if err := client(n.Addr, func(ctx context.Context, rc *redis.Client) (err error) {
		info, err = rc.Info(ctx, "commandstats").Result()
		return err
	}); err != nil {
		t.Fatalf("INFO commandstats on %s: %v", n.Addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.Atoi(v)
			case "failed_calls":
				failed, _ = strconv.Atoi(v)
			}
		}
	}
	return calls, failed
}
