package config_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
)

// Tests of the redis section and the global-rate rules (issue 5,
// docs/scaling.md).

func TestLoad_RedisDefaults(t *testing.T) {
	c, warns := mustLoad(t, laneYAML(""))
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	want := config.Redis{KeyPrefix: "shaper", Timeout: 50 * time.Millisecond, ReplicasHint: 1}
	if c.Redis != want {
		t.Errorf("redis = %+v, want %+v", c.Redis, want)
	}
}

func TestLoad_RedisSection(t *testing.T) {
	t.Setenv("SHAPER_TEST_REDIS_USER", "shaper-user")
	t.Setenv("SHAPER_TEST_REDIS_PASSWORD", "pw-123")
	c, warns := mustLoad(t, laneYAML(`redis:
  addr: 10.0.0.1:6379, 10.0.0.2:6379
  username: ${SHAPER_TEST_REDIS_USER}
  password: ${SHAPER_TEST_REDIS_PASSWORD}
  tls: true
  key_prefix: prod-shaper
  timeout: 20ms
  replicas_hint: 3`, "rate: {limit: 100/s, global: true}"))
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	want := config.Redis{Addr: "10.0.0.1:6379, 10.0.0.2:6379", Username: "shaper-user", Password: "pw-123",
		TLS: true, KeyPrefix: "prod-shaper", Timeout: 20 * time.Millisecond, ReplicasHint: 3}
	if c.Redis != want {
		t.Errorf("redis = %+v\nwant %+v", c.Redis, want)
	}
	if !c.Downstreams["payments"].Rate.Global {
		t.Error("rate.global not set")
	}
	r := c.Redacted()
	if r.Redis.Password != "${SHAPER_TEST_REDIS_PASSWORD}" || r.Redis.Username != "${SHAPER_TEST_REDIS_USER}" {
		t.Errorf("redacted redis = %+v", r.Redis)
	}
	if strings.Contains(fmt.Sprintf("%+v", *r), "pw-123") {
		t.Error("Redacted shows the password")
	}
}

func TestLoad_RedisFromEnvironment(t *testing.T) {
	t.Setenv("SHAPER_REDIS_ADDR", "127.0.0.1:6380")
	t.Setenv("SHAPER_REDIS_REPLICAS_HINT", "4")
	t.Setenv("SHAPER_REDIS_TIMEOUT", "75ms")
	t.Setenv("SHAPER_REDIS_DB", "2")
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_RATE_GLOBAL", "true")
	c, _ := mustLoad(t, laneYAML(""))
	if c.Redis.Addr != "127.0.0.1:6380" || c.Redis.ReplicasHint != 4 || c.Redis.Timeout != 75*time.Millisecond || c.Redis.DB != 2 {
		t.Errorf("redis = %+v", c.Redis)
	}
	if !c.Downstreams["payments"].Rate.Global {
		t.Error("rate.global from the environment did not reach the config")
	}
}

func TestRedactedLiteralRedisPassword(t *testing.T) {
	c, _ := mustLoad(t, laneYAML("redis: {addr: '127.0.0.1:6379', password: literal-pw, replicas_hint: 2}", "rate: {limit: 10/s, global: true}"))
	if c.Redis.Password != "literal-pw" {
		t.Fatalf("password = %q", c.Redis.Password)
	}
	if got := c.Redacted().Redis.Password; got != "[REDACTED]" {
		t.Errorf("redacted password = %q", got)
	}
}

func TestLoad_RedisBroken(t *testing.T) {
	runBroken(t, []brokenCase{
		{name: "db negative", text: laneYAML("redis: {db: -1}"),
			key: "redis.db", want: []string{"got -1"}},
		{name: "db on a cluster", text: laneYAML("redis: {addr: 'a:1,b:2', db: 3}"),
			key: "redis.db", want: []string{"Cluster", "got 3"}},
		{name: "db on a single-seed cluster", text: laneYAML("redis: {addr: 'a:1', cluster: true, db: 1}"),
			key: "redis.db", want: []string{"Cluster", "got 1"}},
		{name: "timeout 0s", text: laneYAML("redis: {timeout: 0s}"),
			key: "redis.timeout", want: []string{"> 0", "0s"}},
		{name: "timeout bare number", text: laneYAML("redis: {timeout: 50}"),
			key: "redis.timeout", want: []string{`"50"`, "unit"}},
		{name: "key_prefix empty", text: laneYAML("redis: {key_prefix: ''}"),
			key: "redis.key_prefix", want: []string{"empty"}},
		{name: "key_prefix braces", text: laneYAML("redis: {key_prefix: '{x}'}"),
			key: "redis.key_prefix", want: []string{`"{x}"`, "braces"}},
		{name: "tls yes", text: laneYAML("redis: {tls: yes}"),
			key: "redis.tls", want: []string{`"yes"`, "true or false"}},
		{name: "bad item in list", text: laneYAML("redis: {addr: '127.0.0.1:6379,nohost'}"),
			key: "redis.addr", want: []string{`"nohost"`, "host:port"}},
		{name: "url scheme", text: laneYAML("redis: {addr: 'http://127.0.0.1:6379'}"),
			key: "redis.addr", want: []string{"redis or rediss"}},
		{name: "unset password env", text: laneYAML("redis: {addr: '127.0.0.1:6379', password: '${SHAPER_TEST_UNSET_REDIS_PW}'}"),
			key: "redis.password", want: []string{"${SHAPER_TEST_UNSET_REDIS_PW}", "not set"}},
		{name: "sentinel without addresses", text: laneYAML("redis: {master_name: mymaster}"),
			key: "redis.master_name", want: []string{"sentinels"}},
		{name: "sentinel and cluster", text: laneYAML("redis: {addr: '10.0.0.1:26379', master_name: mymaster, cluster: true}"),
			key: "redis.master_name", want: []string{"redis.cluster"}},
		{name: "unknown redis key", text: laneYAML("redis: {adress: '127.0.0.1:6379'}"),
			key: "redis.adress", want: []string{"unknown key"}},
	})
}

func TestLoad_RedisWarnings(t *testing.T) {
	t.Run("replicas_hint 1 with a global lane", func(t *testing.T) {
		_, warns := mustLoad(t, laneYAML("redis: {addr: '127.0.0.1:6379'}", "rate: {limit: 100/s, global: true}"))
		requireWarning(t, warns, "redis.replicas_hint", "full limit")
	})
	t.Run("long timeout", func(t *testing.T) {
		_, warns := mustLoad(t, laneYAML("redis: {timeout: 2s}"))
		requireWarning(t, warns, "redis.timeout", "2s")
	})
	t.Run("sentinel and url addresses", func(t *testing.T) {
		_, warns := mustLoad(t, laneYAML("redis: {addr: 'rediss://u:p@10.0.0.1:26379, 10.0.0.2:26379', master_name: mymaster, db: 1, replicas_hint: 2}",
			"rate: {limit: 100/s, global: true}"))
		if len(warns) != 0 {
			t.Errorf("warnings: %v", warns)
		}
	})
}

// TestCase_C23_BurstAboveRatePerPeriodWarns: go-redis/redis_rate#24 — a
// burst is extra allowance on top of the rate, so a burst larger than what
// the limit allows in a period more than doubles what the downstream sees.
// shaper's burst is rate.slack (burst b of redis_rate is slack b-1: the
// departure itself is not counted); startup warns when the slack exceeds
// the limit's departures per second. The schedule's side of C23 is tested
// in sources (TestCase_C23_GlobalBurst).
func TestCase_C23_BurstAboveRatePerPeriodWarns(t *testing.T) {
	// 17 per 30 s is 34/m; one second allows 0.57.
	_, warns := mustLoad(t, laneYAML("", "rate: {limit: 34/m, slack: 16}", "bucket: {capacity: 10}"))
	requireWarning(t, warns, lanePfx+"rate.slack", "16", "0.5667/s")
	_, warns = mustLoad(t, laneYAML("", "rate: {limit: 100/s, slack: 100}"))
	for _, w := range warns {
		if w.Key == lanePfx+"rate.slack" {
			t.Errorf("slack 100 at 100/s warned: %v", w)
		}
	}
	_, warns = mustLoad(t, laneYAML("", "rate: {limit: 100/s, slack: 101}"))
	requireWarning(t, warns, lanePfx+"rate.slack", "101")
}
