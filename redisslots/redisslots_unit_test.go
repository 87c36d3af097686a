package redisslots

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaper-dev/shaper/config"
)

// Pure parts of the Redis edge: lease sizing, the clock conversion, the
// mapping of the redis section to go-redis options.

func TestLeaseSize(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		k    int
	}{
		{1, 1}, {100, 1}, {150, 1}, {500, 1}, {600, 1}, {1000, 2}, {2500, 5}, {10000, 20}, {20000, 40},
	} {
		if k := leaseSize(interval(tc.rate)); k != tc.k {
			t.Errorf("leaseSize at %v/s = %d, want %d", tc.rate, k, tc.k)
		}
		if span := time.Duration(leaseSize(interval(tc.rate))) * interval(tc.rate); tc.k > 1 && span > leaseSpan {
			t.Errorf("a lease at %v/s spans %v > %v", tc.rate, span, leaseSpan)
		}
	}
}

// TestClockSync: the conversion keeps the sample with the smallest round
// trip, is not moved by a slower one that agrees with it, and follows a
// sample that contradicts it (the server's clock moved).
func TestClockSync(t *testing.T) {
	t0 := time.Unix(5000, 0)
	server := func(at time.Time, off time.Duration) float64 {
		return float64(at.Add(off).UnixNano()) / 1e3
	}
	const off = 3 * time.Second // server clock ahead of the local one
	var c clockSync
	// A lopsided first sample: 2 ms round trip, the server read its clock
	// 0.2 ms after the call began (not at the midpoint).
	c.observe(t0, t0.Add(2*time.Millisecond), server(t0.Add(200*time.Microsecond), off))
	if err := c.local(server(t0, off)).Sub(t0); err.Abs() > time.Millisecond {
		t.Fatalf("first sample: error %v, want within half its round trip", err)
	}
	// A tight sample later: 60 µs.
	t1 := t0.Add(time.Second)
	c.observe(t1, t1.Add(60*time.Microsecond), server(t1.Add(30*time.Microsecond), off))
	if err := c.local(server(t1, off)).Sub(t1); err.Abs() > time.Microsecond {
		t.Errorf("after a tight sample: error %v", err)
	}
	// A slow, lopsided sample that agrees within its uncertainty: kept out.
	t2 := t1.Add(time.Second)
	c.observe(t2, t2.Add(4*time.Millisecond), server(t2.Add(100*time.Microsecond), off))
	if err := c.local(server(t2, off)).Sub(t2); err.Abs() > 2*time.Microsecond {
		t.Errorf("a slow sample moved the conversion: error %v", err)
	}
	// The server's clock jumps 50 ms ahead: the next sample contradicts
	// the anchor and replaces it.
	t3 := t2.Add(time.Second)
	jumped := off + 50*time.Millisecond
	c.observe(t3, t3.Add(100*time.Microsecond), server(t3.Add(50*time.Microsecond), jumped))
	if err := c.local(server(t3, jumped)).Sub(t3); err.Abs() > 10*time.Microsecond {
		t.Errorf("after the server's clock moved: error %v", err)
	}
}

func TestUniversalOptions(t *testing.T) {
	base := config.Redis{KeyPrefix: "shaper", Timeout: 50 * time.Millisecond, ReplicasHint: 1}
	with := func(f func(r *config.Redis)) config.Redis { r := base; f(&r); return r }
	for _, tc := range []struct {
		name    string
		cfg     config.Redis
		addrs   []string
		user    string
		pass    string
		db      int
		tls     bool
		cluster bool
		master  string
	}{
		{name: "host:port", cfg: with(func(r *config.Redis) { r.Addr = "127.0.0.1:6379" }), addrs: []string{"127.0.0.1:6379"}},
		{name: "url with credentials and db", cfg: with(func(r *config.Redis) { r.Addr = "rediss://u:p@redis:6380/2" }),
			addrs: []string{"redis:6380"}, user: "u", pass: "p", db: 2, tls: true},
		{name: "explicit fields win", cfg: with(func(r *config.Redis) {
			r.Addr, r.Username, r.Password, r.DB, r.TLS = "redis://u:p@redis:6379/2", "me", "secret", 3, true
		}), addrs: []string{"redis:6379"}, user: "me", pass: "secret", db: 3, tls: true},
		{name: "cluster list", cfg: with(func(r *config.Redis) { r.Addr = "a:1, b:2,c:3" }), addrs: []string{"a:1", "b:2", "c:3"}, cluster: true},
		{name: "single-seed cluster", cfg: with(func(r *config.Redis) { r.Addr, r.Cluster = "a:1", true }), addrs: []string{"a:1"}, cluster: true},
		{name: "sentinel", cfg: with(func(r *config.Redis) { r.Addr, r.MasterName = "s1:26379,s2:26379", "mymaster" }),
			addrs: []string{"s1:26379", "s2:26379"}, master: "mymaster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uo, err := universalOptions(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(uo.Addrs) != len(tc.addrs) {
				t.Fatalf("addrs %v, want %v", uo.Addrs, tc.addrs)
			}
			for i := range tc.addrs {
				if uo.Addrs[i] != tc.addrs[i] {
					t.Errorf("addrs %v, want %v", uo.Addrs, tc.addrs)
				}
			}
			if uo.Username != tc.user || uo.Password != tc.pass || uo.DB != tc.db || (uo.TLSConfig != nil) != tc.tls ||
				uo.MasterName != tc.master || uo.MaxRetries != -1 || uo.DialTimeout != 50*time.Millisecond || uo.ReadTimeout != retryTimeouts*50*time.Millisecond || !uo.ContextTimeoutEnabled {
				t.Errorf("options %+v", uo)
			}
			c := redis.NewUniversalClient(uo)
			defer c.Close()
			_, isCluster := c.(*redis.ClusterClient)
			if isCluster != tc.cluster {
				t.Errorf("cluster client %v, want %v (%T)", isCluster, tc.cluster, c)
			}
		})
	}
	if _, err := universalOptions(with(func(r *config.Redis) { r.Addr = "redis://h:1/x" })); err == nil {
		t.Error("a URL path that is not a database number was accepted")
	}
}

// TestRedisKeyHasHashTag: every key of a lane is inside one {hash tag}, so
// a Redis Cluster keeps the lane in one slot (case C26a: no CROSSSLOT).
func TestRedisKeyHasHashTag(t *testing.T) {
	rs, err := NewRedisSlots(config.Redis{Addr: "127.0.0.1:1", KeyPrefix: "prod", Timeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if k := rs.Key("payments"); k != "{prod:payments}:schedule" {
		t.Errorf("key %q", k)
	}
}
