package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestSubjectsOverlap(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.*.c", "a.b.*", true},
		{">", "shaper.dead.x", true},
		{"callbacks.payments.>", "callbacks.refunds.>", false},
		{"callbacks.>", "callbacks.refunds.>", true},
		{"a.b", "a.b.c", false},
	} {
		if got := subjectsOverlap(tc.a, tc.b); got != tc.want {
			t.Errorf("subjectsOverlap(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := subjectsOverlap(tc.b, tc.a); got != tc.want {
			t.Errorf("subjectsOverlap(%q, %q) = %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestBadSubjectAndName(t *testing.T) {
	for s, bad := range map[string]bool{
		"callbacks.payments.>": false, "a.*.c": false, "a": false, "a*b.c": false,
		"": true, ".a": true, "a.": true, "a..b": true, "a b": true, "a.>.b": true, "a.\t": true,
	} {
		if got := badSubject(s) != ""; got != bad {
			t.Errorf("badSubject(%q) = %q, want bad=%v", s, badSubject(s), bad)
		}
	}
	for s, bad := range map[string]bool{
		"CALLBACKS": false, "shaper-payments": false, "a_b": false,
		"": true, "a.b": true, "a*": true, "a>": true, "a b": true, "a/b": true, `a\b`: true,
	} {
		if got := badName(s) != ""; got != bad {
			t.Errorf("badName(%q) = %q, want bad=%v", s, badName(s), bad)
		}
	}
	if badPublishSubject("a.*") == "" || badPublishSubject("a.>") == "" || badPublishSubject("shaper.dead.x") != "" {
		t.Error("badPublishSubject accepts a wildcard or rejects a plain subject")
	}
}

func TestKeyFromDecoderName(t *testing.T) {
	for in, want := range map[string]string{
		"rate.limit":               "rate.limit",
		"sink.headers[x-token]":    "sink.headers.x-token",
		"task.retry.backoff[0]":    "task.retry.backoff[0]",
		"source.subjects[12]":      "source.subjects[12]",
		"":                         "",
		"weird[unterminated":       "weird[unterminated",
		"sink.headers[a].value[3]": "sink.headers.a.value[3]",
	} {
		if got := keyFromDecoderName(in); got != want {
			t.Errorf("keyFromDecoderName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestExpandEnv(t *testing.T) {
	t.Setenv("SHAPER_TEST_A", "alpha")
	t.Setenv("SHAPER_TEST_EMPTY", "")
	for _, tc := range []struct {
		in, out string
		changed bool
		errHas  string
	}{
		{in: "plain", out: "plain"},
		{in: "cost $5", out: "cost $5"},
		{in: "${SHAPER_TEST_A}", out: "alpha", changed: true},
		{in: "x-${SHAPER_TEST_A}-${SHAPER_TEST_A}", out: "x-alpha-alpha", changed: true},
		{in: "${SHAPER_TEST_NOPE}", changed: true, errHas: "${SHAPER_TEST_NOPE}"},
		{in: "${SHAPER_TEST_EMPTY}", changed: true, errHas: "${SHAPER_TEST_EMPTY}"},
		{in: "${SHAPER_TEST_A", changed: true, errHas: "unterminated"},
		{in: "${1X}", changed: true, errHas: "not a valid reference"},
	} {
		out, changed, err := expandEnv(tc.in)
		if changed != tc.changed {
			t.Errorf("expandEnv(%q) changed = %v", tc.in, changed)
		}
		if tc.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("expandEnv(%q) err = %v, want %q", tc.in, err, tc.errHas)
			}
			if err != nil && strings.Contains(err.Error(), "alpha") {
				t.Errorf("expandEnv(%q) error shows a value: %v", tc.in, err)
			}
			continue
		}
		if err != nil || out != tc.out {
			t.Errorf("expandEnv(%q) = %q, %v; want %q", tc.in, out, err, tc.out)
		}
	}
}

// TestRedactURL: issue 12 — passwords, token user names and credential
// query values of every URL in a list are masked; the rest is kept.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://bob:hunter2@h:4222":                    "nats://bob:***@h:4222",
		"https://token@h/x":                            "https://***@h/x",
		"nats://a:4222,nats://u:pw@b:4222":             "nats://a:4222,nats://u:***@b:4222",
		"nats://u:p1@a:4222, nats://u:p2@b:4222":       "nats://u:***@a:4222, nats://u:***@b:4222",
		"tls://u:p%40ss@h:4222":                        "tls://u:***@h:4222",
		"redis://:s3cret@127.0.0.1:6379/2":             "redis://:***@127.0.0.1:6379/2",
		"rediss://default:pw@r1:6380,rediss://r2:6380": "rediss://default:***@r1:6380,rediss://r2:6380",
		"bob:hunter2@host:4222":                        "***@host:4222",
		"https://h/cb?token=abc&x=1":                   "https://h/cb?token=***&x=1",
		"127.0.0.1:6379":                               "127.0.0.1:6379",
		"http://example.com/callback?x=1":              "http://example.com/callback?x=1",
		"":                                             "",
	} {
		got := RedactURL(in)
		if got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
		for _, secret := range []string{"hunter2", "s3cret", "p1", "p2", "p%40ss", "abc", ":pw@"} {
			if strings.Contains(in, secret) && strings.Contains(got, secret) {
				t.Errorf("RedactURL(%q) = %q still shows %q", in, got, secret)
			}
		}
	}
}

// The defaults tables use only keys that exist, so a renamed field cannot
// leave a default behind silently.
func TestDefaultTablesMatchKeys(t *testing.T) {
	lane := map[string]bool{}
	for _, k := range leafKeys("", typeOfLane) {
		lane[k] = true
	}
	for k := range laneDefaults() {
		if !lane[k] {
			t.Errorf("lane default for unknown key %q", k)
		}
	}
	top := map[string]bool{}
	for _, k := range leafKeys("", typeOfConfig) {
		top[k] = true
	}
	for k := range topDefaults() {
		if !top[k] {
			t.Errorf("default for unknown key %q", k)
		}
	}
}

var (
	typeOfLane   = reflect.TypeFor[Lane]()
	typeOfConfig = reflect.TypeFor[Config]()
)
