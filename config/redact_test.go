package config_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shaper-dev/shaper/config"
)

// TestLoad_EnvURLPasswordRedacted: issue 12 — a nats.url or redis.addr
// with a password given by an environment override (not a ${ENV}
// reference) is redacted in Load's error messages and in Redacted.
func TestLoad_EnvURLPasswordRedacted(t *testing.T) {
	const pw = "hunter2-env"
	t.Run("invalid", func(t *testing.T) {
		t.Setenv("SHAPER_NATS_URL", "nats://bob:"+pw+"@a:4222,http://bob:"+pw+"@b:4222")
		t.Setenv("SHAPER_REDIS_ADDR", "redis://:"+pw+"@/0")
		err := loadErr(t, laneYAML(""))
		requireProblem(t, err, "nats.url", "bob:***@")
		requireProblem(t, err, "redis.addr")
		if strings.Contains(err.Error(), pw) {
			t.Errorf("the password appears in the errors:\n%v", err)
		}
	})
	t.Run("valid", func(t *testing.T) {
		t.Setenv("SHAPER_NATS_URL", "nats://bob:"+pw+"@a:4222,nats://bob:"+pw+"@b:4222")
		t.Setenv("SHAPER_REDIS_ADDR", "redis://u:"+pw+"@r:6379")
		c, warns := mustLoad(t, laneYAML(""))
		if !strings.Contains(c.NATS.URL, pw) {
			t.Fatal("the override did not apply: the test would prove nothing")
		}
		r := c.Redacted()
		if r.NATS.URL != "nats://bob:***@a:4222,nats://bob:***@b:4222" || r.Redis.Addr != "redis://u:***@r:6379" {
			t.Errorf("Redacted: nats.url %q, redis.addr %q", r.NATS.URL, r.Redis.Addr)
		}
		if dump := fmt.Sprintf("%+v %v", *r, warns); strings.Contains(dump, pw) {
			t.Errorf("Redacted or the warnings show the password: %s", dump)
		}
		if got := config.RedactURL(c.NATS.URL); got != r.NATS.URL {
			t.Errorf("RedactURL %q and Redacted %q disagree", got, r.NATS.URL)
		}
	})
}
