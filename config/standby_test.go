package config_test

import (
	"testing"
)

// TestLoad_Standby: source.standby (SPEC §3 Standby) loads; it is warned
// about with the embedded server (no replica could take over) and with
// rate.global (redundant), and is quiet with a shared nats.url.
func TestLoad_Standby(t *testing.T) {
	c, warns := mustLoad(t, laneYAML("nats: {url: nats://10.0.0.1:4222}",
		"source: {stream: CALLBACKS, subjects: [callbacks.payments.>], standby: true}"))
	if !c.Downstreams["payments"].Source.Standby {
		t.Fatal("source.standby did not load")
	}
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	c, _ = mustLoad(t, laneYAML(""))
	if c.Downstreams["payments"].Source.Standby {
		t.Error("source.standby defaults to true")
	}
	_, warns = mustLoad(t, laneYAML("",
		"source: {stream: CALLBACKS, subjects: [callbacks.payments.>], standby: true}"))
	requireWarning(t, warns, "downstreams.payments.source.standby", "embedded")
	_, warns = mustLoad(t, laneYAML("nats: {url: nats://10.0.0.1:4222}\nredis: {addr: 10.0.0.2:6379, replicas_hint: 2}",
		"source: {stream: CALLBACKS, subjects: [callbacks.payments.>], standby: true}",
		"rate: {limit: 100/s, global: true}"))
	requireWarning(t, warns, "downstreams.payments.source.standby", "rate.global")
}

// TestLoad_StandbyFromEnvironment: the key is reachable from the
// environment like every lane key.
func TestLoad_StandbyFromEnvironment(t *testing.T) {
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_SOURCE_STANDBY", "true")
	c, _ := mustLoad(t, laneYAML("nats: {url: nats://10.0.0.1:4222}"))
	if !c.Downstreams["payments"].Source.Standby {
		t.Error("SHAPER_DOWNSTREAMS_PAYMENTS_SOURCE_STANDBY=true did not reach the config")
	}
}
