package config_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shaper-dev/shaper/config"
)

// Secrets of these tests: two valid Standard Webhooks secrets (24 bytes) and
// one that does not decode.
const (
	whOld = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	whNew = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	whBad = "whsec_hunter2!!notbase64"
)

// httpSink is a sink section for laneYAML with an http sink and extra keys.
func httpSink(url, extra string) string {
	return fmt.Sprintf("sink: {kind: http, url: %q%s}", url, extra)
}

// TestLoad_Signing: sink.signing — a known scheme, at least one secret, each
// decoding, only for http, no header that the signature headers would
// overwrite; secrets from ${ENV}; every problem with its key path and no
// error quoting a secret.
func TestLoad_Signing(t *testing.T) {
	t.Run("valid, secrets from the environment", func(t *testing.T) {
		t.Setenv("WH_NEW", whNew)
		t.Setenv("WH_OLD", whOld)
		c, warns := mustLoad(t, laneYAML("", httpSink("https://h/cb", `, signing: {scheme: standard-webhooks, secrets: ["${WH_NEW}", "${WH_OLD}"]}`)))
		sg := c.Downstreams["payments"].Sink.Signing
		if sg.Scheme != config.SigningStandardWebhooks || len(sg.Secrets) != 2 || sg.Secrets[0] != whNew || sg.Secrets[1] != whOld {
			t.Fatalf("signing %+v: want the expanded secrets", sg)
		}
		for _, w := range warns {
			if strings.Contains(w.Key, "signing") {
				t.Errorf("unexpected warning %s", w)
			}
		}
	})
	t.Run("off by default", func(t *testing.T) {
		c, _ := mustLoad(t, laneYAML("", httpSink("https://h/cb", "")))
		if sg := c.Downstreams["payments"].Sink.Signing; sg.Scheme != "" || len(sg.Secrets) != 0 {
			t.Fatalf("default signing %+v, want none", sg)
		}
	})
	const key = "downstreams.payments.sink."
	for _, tc := range []struct {
		name, extra, key string
		want             []string
	}{
		{"unknown scheme", `, signing: {scheme: hmac-sha1, secrets: [` + whOld + `]}`, key + "signing.scheme", []string{"must be standard-webhooks", `"hmac-sha1"`}},
		{"no secret", `, signing: {scheme: standard-webhooks}`, key + "signing.secrets", []string{"at least one secret"}},
		{"empty list", `, signing: {scheme: standard-webhooks, secrets: []}`, key + "signing.secrets", []string{"at least one secret"}},
		{"a secret that does not decode", `, signing: {scheme: standard-webhooks, secrets: [` + whOld + `, "` + whBad + `"]}`, key + "signing.secrets[1]", []string{"not whsec_ followed by standard base64"}},
		{"secrets without a scheme", `, signing: {secrets: [` + whOld + `]}`, key + "signing.scheme", []string{"required when signing.secrets are set"}},
		{"a header the signature sets", `, headers: {webhook-id: x}, signing: {scheme: standard-webhooks, secrets: [` + whOld + `]}`, key + "headers.webhook-id", []string{"reserved: sink.signing sets it"}},
		{"an unknown signing key", `, signing: {scheme: standard-webhooks, secret: [` + whOld + `]}`, key + "signing.secret", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadErr(t, laneYAML("", httpSink("https://h/cb", tc.extra)))
			requireProblem(t, err, tc.key, tc.want...)
			for _, s := range []string{whOld, whBad, "MfKQ9r8", "hunter2"} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("the errors quote a secret (%q):\n%v", s, err)
				}
			}
		})
	}
	t.Run("an unset variable names it, not a value", func(t *testing.T) {
		err := loadErr(t, laneYAML("", httpSink("https://h/cb", `, signing: {scheme: standard-webhooks, secrets: ["${WH_UNSET_X}"]}`)))
		requireProblem(t, err, key+"signing.secrets[0]", "${WH_UNSET_X}", "not set")
	})
	t.Run("ignored with a warning for other kinds", func(t *testing.T) {
		_, warns := mustLoad(t, laneYAML("", `sink: {kind: log, signing: {scheme: standard-webhooks, secrets: [`+whOld+`]}}`))
		requireWarning(t, warns, key+"signing.scheme", "ignored for sink kind log")
	})
	t.Run("a short key warns", func(t *testing.T) {
		_, warns := mustLoad(t, laneYAML("", httpSink("https://h/cb", `, signing: {scheme: standard-webhooks, secrets: ["whsec_c2hvcnQ="]}`)))
		requireWarning(t, warns, key+"signing.secrets[0]", "5 bytes", "24 to 64")
	})
}

// TestConfig_RedactedSigning: Redacted shows a secret as its ${ENV}
// reference, a literal one (or one from an override) as [REDACTED], and
// leaves the config itself alone.
func TestConfig_RedactedSigning(t *testing.T) {
	t.Run("literal", func(t *testing.T) {
		c, _ := mustLoad(t, laneYAML("", httpSink("https://h/cb", `, signing: {scheme: standard-webhooks, secrets: [`+whOld+`]}`)))
		if got := c.Redacted().Downstreams["payments"].Sink.Signing.Secrets; len(got) != 1 || got[0] != "[REDACTED]" {
			t.Errorf("Redacted literal secret %q, want [REDACTED]", got)
		}
	})
	t.Setenv("WH_NEW", whNew)
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_SINK_SIGNING_SECRETS", "${WH_NEW},"+whOld) // an override: literal text
	c, _ := mustLoad(t, laneYAML("", httpSink("https://h/cb", `, signing: {scheme: standard-webhooks, secrets: ["${WH_NEW}"]}`)))
	if got := c.Downstreams["payments"].Sink.Signing.Secrets; len(got) != 2 || got[1] != whOld {
		t.Fatalf("the override did not apply (%d secrets): the test would prove nothing", len(got))
	}
	r := c.Redacted()
	got := r.Downstreams["payments"].Sink.Signing.Secrets
	if len(got) != 2 || got[0] != "${WH_NEW}" || got[1] != "[REDACTED]" {
		t.Errorf("Redacted secrets %q, want [${WH_NEW} [REDACTED]]", got)
	}
	if dump := fmt.Sprintf("%+v", *r); strings.Contains(dump, whNew) || strings.Contains(dump, whOld) {
		t.Errorf("Redacted shows a secret: %s", dump)
	}
	if s := c.Downstreams["payments"].Sink.Signing.Secrets; s[0] != whNew || s[1] != whOld {
		t.Errorf("Redacted modified the config: %q", s)
	}
}

// TestLoad_URLTemplate: sink.url placeholders (SPEC §3 Per-message address)
// are checked at load by the sink's parser, with the key path; a
// {subject:N} must fit the lane's source subjects.
func TestLoad_URLTemplate(t *testing.T) {
	c, _ := mustLoad(t, laneYAML("", httpSink("https://psp.example/m/{header:merchant}/cb?region={subject:2}", "")))
	if u := c.Downstreams["payments"].Sink.URL; u != "https://psp.example/m/{header:merchant}/cb?region={subject:2}" {
		t.Errorf("sink.url %q, want the template as written", u)
	}
	const key = "downstreams.payments.sink.url"
	for _, tc := range []struct {
		name, url, source string
		want              []string
	}{
		{"host", "https://{header:merchant}.psp.example/cb", "", []string{"placeholder {header:merchant} in the scheme, host or port"}},
		{"port", "https://psp.example:{header:port}/cb", "", []string{"in the scheme, host or port"}},
		{"unknown", "https://psp.example/{merchant}/cb", "", []string{"unknown placeholder {merchant}"}},
		{"subject too short", "https://psp.example/{subject:3}/cb", "source: {stream: CALLBACKS, subjects: [callbacks.payments.eu]}",
			[]string{"{subject:3}", `source.subjects[0] "callbacks.payments.eu" has 3`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sections := []string{httpSink(tc.url, "")}
			if tc.source != "" {
				sections = append(sections, tc.source)
			}
			err := loadErr(t, laneYAML("", sections...))
			requireProblem(t, err, key, tc.want...)
			if strings.Contains(err.Error(), "psp.example") {
				t.Errorf("the error quotes the URL:\n%v", err)
			}
		})
	}
	// A trailing ">" may supply any token.
	mustLoad(t, laneYAML("", httpSink("https://psp.example/{subject:7}/cb", "")))
}
