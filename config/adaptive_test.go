package config_test

import (
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
)

func TestLoad_AdaptiveAndQuotaDefaults(t *testing.T) {
	c, warns := mustLoad(t, laneYAML(""))
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	r := c.Downstreams["payments"].Rate
	if r.Adaptive.Min.On() || r.Adaptive.Min != 0 || r.Adaptive.Cooldown != 5*time.Second || !r.Adaptive.Headers {
		t.Errorf("rate.adaptive = %+v, want {min off, cooldown 5s, headers true}", r.Adaptive)
	}
	if r.Quota.Count != 0 || r.Quota.Per != 24*time.Hour {
		t.Errorf("rate.quota = %+v, want {0, 24h}", r.Quota)
	}
}

func TestLoad_AdaptiveAndQuota(t *testing.T) {
	c, _ := mustLoad(t, laneYAML("", `rate: {limit: 100/s, adaptive: {min: 10/s, cooldown: 2s, headers: false}, quota: {count: 300, per: 10s}}`))
	r := c.Downstreams["payments"].Rate
	if r.Adaptive.Min != 10 || r.Adaptive.Cooldown != 2*time.Second || r.Adaptive.Headers {
		t.Errorf("rate.adaptive = %+v", r.Adaptive)
	}
	if r.Quota != (config.Quota{Count: 300, Per: 10 * time.Second}) {
		t.Errorf("rate.quota = %+v", r.Quota)
	}
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_RATE_ADAPTIVE_MIN", "600/m")
	c, _ = mustLoad(t, laneYAML(""))
	if got := c.Downstreams["payments"].Rate.Adaptive.Min; got != 10 {
		t.Errorf("rate.adaptive.min from the environment = %v, want 10", got)
	}
}

func TestLoad_BrokenAdaptiveAndQuota(t *testing.T) {
	runBroken(t, []brokenCase{
		{name: "adaptive min above limit", text: laneYAML("", "rate: {limit: 100/s, adaptive: {min: 200/s}}"),
			key: lanePfx + "rate.adaptive.min", want: []string{"≤ rate.limit", "100/s", "200/s"}},
		{name: "adaptive min words", text: laneYAML("", "rate: {limit: 100/s, adaptive: {min: slow}}"),
			key: lanePfx + "rate.adaptive.min", want: []string{`"slow"`, `"" (off)`}},
		{name: "adaptive min 0/s", text: laneYAML("", "rate: {limit: 100/s, adaptive: {min: 0/s}}"),
			key: lanePfx + "rate.adaptive.min", want: []string{`"0/s"`, "positive"}},
		{name: "adaptive cooldown 0s", text: laneYAML("", "rate: {limit: 100/s, adaptive: {min: 10/s, cooldown: 0s}}"),
			key: lanePfx + "rate.adaptive.cooldown", want: []string{"> 0", "0s"}},
		{name: "adaptive cooldown bare", text: laneYAML("", "rate: {limit: 100/s, adaptive: {min: 10/s, cooldown: 5}}"),
			key: lanePfx + "rate.adaptive.cooldown", want: []string{`"5"`, "unit"}},
		{name: "adaptive with global", text: laneYAML("redis: {addr: 127.0.0.1:6379}", "rate: {limit: 100/s, global: true, adaptive: {min: 10/s}}"),
			key: lanePfx + "rate.adaptive.min", want: []string{"rate.global"}},
		{name: "quota count negative", text: laneYAML("", "rate: {limit: 100/s, quota: {count: -1}}"),
			key: lanePfx + "rate.quota.count", want: []string{"got -1"}},
		{name: "quota count too large", text: laneYAML("", "rate: {limit: 100/s, quota: {count: 10000001}}"),
			key: lanePfx + "rate.quota.count", want: []string{"10000000", "got 10000001"}},
		{name: "quota per 0s", text: laneYAML("", "rate: {limit: 100/s, quota: {count: 10, per: 0s}}"),
			key: lanePfx + "rate.quota.per", want: []string{"> 0", "0s"}},
	})
}

func TestLoad_QuotaThatNeverBindsWarns(t *testing.T) {
	_, warns := mustLoad(t, laneYAML("", "rate: {limit: 10/s, quota: {count: 100, per: 10s}}"))
	requireWarning(t, warns, lanePfx+"rate.quota.count", "never binds")
	_, warns = mustLoad(t, laneYAML("", "rate: {limit: 10/s, quota: {count: 99, per: 10s}}"))
	for _, w := range warns {
		if w.Key == lanePfx+"rate.quota.count" {
			t.Errorf("unexpected warning %v", w)
		}
	}
}

// TestLoad_AdaptiveG7Warning: the worst-case wait of SPEC G7 uses the
// lowest rate the adaptive rate may reach: 1000 / 10/s + 5s = 1m45s > 60s.
func TestLoad_AdaptiveG7Warning(t *testing.T) {
	_, warns := mustLoad(t, laneYAML("", "rate: {limit: 100/s, adaptive: {min: 10/s}}"))
	requireWarning(t, warns, lanePfx+"source.ack_wait", "1m45s", "rate.adaptive.min 10/s")
}

// TestLoad_QuotaWithGlobal: a quota with rate.global is shared through
// Redis (SPEC §3 Quota), so the loader accepts it as it is.
func TestLoad_QuotaWithGlobal(t *testing.T) {
	c, warns := mustLoad(t, laneYAML("redis: {addr: 127.0.0.1:6379, replicas_hint: 2}", "rate: {limit: 50/s, global: true, quota: {count: 300, per: 10s}}"))
	for _, w := range warns {
		if w.Key == lanePfx+"rate.quota.count" {
			t.Errorf("warning on rate.quota.count: %v", w)
		}
	}
	r := c.Downstreams["payments"].Rate
	if !r.Global || r.Quota != (config.Quota{Count: 300, Per: 10 * time.Second}) {
		t.Errorf("rate = global %v quota %+v, want global with {300, 10s}", r.Global, r.Quota)
	}
}
