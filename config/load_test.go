package config_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// writeConfig writes text to config.yaml in a fresh directory and returns
// its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// laneYAML returns a config with one lane "payments" made of the given
// sections ("rate: {limit: 0/s}"), each replacing the valid default of its
// section; "rate: -" removes a section. top is prepended verbatim.
func laneYAML(top string, sections ...string) string {
	body := map[string]string{
		"source": "{stream: CALLBACKS, subjects: [callbacks.payments.>]}",
		"rate":   "{limit: 100/s}",
		"sink":   "{kind: log}",
	}
	order := []string{"source", "bucket", "rate", "task", "dead_letter", "sink"}
	for _, s := range sections {
		name, val, _ := strings.Cut(s, ":")
		body[name] = strings.TrimSpace(val)
		if !slices.Contains(order, name) {
			order = append(order, name)
		}
	}
	var b strings.Builder
	b.WriteString(top)
	b.WriteString("\ndownstreams:\n  payments:\n")
	for _, name := range order {
		if val, ok := body[name]; ok && val != "-" {
			fmt.Fprintf(&b, "    %s: %s\n", name, val)
		}
	}
	return b.String()
}

// mustLoad loads text and fails the test on any error.
func mustLoad(t *testing.T, text string) (*config.Config, []config.Warning) {
	t.Helper()
	c, warns, err := config.Load(writeConfig(t, text), nil)
	if err != nil {
		t.Fatalf("Load: unexpected error:\n%v\nconfig:\n%s", err, text)
	}
	return c, warns
}

// loadErr loads text and returns its error, failing the test if there is none.
func loadErr(t *testing.T, text string) error {
	t.Helper()
	c, _, err := config.Load(writeConfig(t, text), nil)
	if err == nil {
		t.Fatalf("Load: no error; config:\n%s", text)
	}
	if c != nil {
		t.Errorf("Load returned a config together with an error")
	}
	return err
}

// requireProblem fails unless err has a line "<key>: ..." (or "<key> (from
// <origin>): ..." for a value from the environment or a flag) that contains
// every one of want (the offending value, a word of the message).
func requireProblem(t *testing.T, err error, key string, want ...string) {
	t.Helper()
	for _, line := range strings.Split(err.Error(), "\n") {
		rest, ok := strings.CutPrefix(line, key+": ")
		if !ok {
			if after, from := strings.CutPrefix(line, key+" (from "); from {
				_, rest, ok = strings.Cut(after, "): ")
			}
		}
		if !ok {
			continue
		}
		missing := false
		for _, w := range want {
			if !strings.Contains(rest, w) {
				missing = true
			}
		}
		if !missing {
			return
		}
	}
	t.Errorf("no problem %q containing %q in:\n%v", key, want, err)
}

// fieldErrors returns the joined *config.FieldError of err.
func fieldErrors(t *testing.T, err error) []*config.FieldError {
	t.Helper()
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error is not a joined list: %T %v", err, err)
	}
	var out []*config.FieldError
	for _, e := range joined.Unwrap() {
		var fe *config.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("problem is not a *config.FieldError: %T %v", e, e)
		}
		out = append(out, fe)
	}
	return out
}

const lanePfx = "downstreams.payments."

// brokenCase is one invalid configuration and the problem it must produce.
type brokenCase struct {
	name string
	text string
	env  map[string]string
	key  string   // full key path the problem is reported under
	want []string // substrings of the message: the offending value, a hint
}

func runBroken(t *testing.T, cases []brokenCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			start := time.Now()
			err := loadErr(t, tc.text)
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Load took %v", d)
			}
			requireProblem(t, err, tc.key, tc.want...)
			for _, fe := range fieldErrors(t, err) {
				if fe.Key == "" || fe.Message == "" {
					t.Errorf("empty key or message: %#v", fe)
				}
				// Issue 12: a value from the environment says so.
				if v, ok := tc.env[config.EnvName(fe.Key)]; ok && v != "" && fe.From != config.EnvName(fe.Key) {
					t.Errorf("%s: From %q, want %s (the value came from there)", fe.Key, fe.From, config.EnvName(fe.Key))
				}
			}
		})
	}
}

func TestLoad_Broken(t *testing.T) {
	runBroken(t, []brokenCase{
		// Rates.
		{name: "rate 0/s", text: laneYAML("", "rate: {limit: 0/s}"),
			key: lanePfx + "rate.limit", want: []string{`"0/s"`, "positive"}},
		{name: "rate -1/s", text: laneYAML("", "rate: {limit: -1/s}"),
			key: lanePfx + "rate.limit", want: []string{`"-1/s"`, "positive"}},
		{name: "rate 10/fortnight", text: laneYAML("", "rate: {limit: 10/fortnight}"),
			key: lanePfx + "rate.limit", want: []string{`"10/fortnight"`, "unit"}},
		{name: "rate bare 0", text: laneYAML("", "rate: {limit: 0}"),
			key: lanePfx + "rate.limit", want: []string{`"0"`, "positive"}},
		{name: "rate words", text: laneYAML("", "rate: {limit: fast}"),
			key: lanePfx + "rate.limit", want: []string{`"fast"`}},
		{name: "rate NaN", text: laneYAML("", "rate: {limit: NaN/s}"),
			key: lanePfx + "rate.limit", want: []string{`"NaN/s"`}},
		{name: "rate missing", text: laneYAML("", "rate: {slack: 0}"),
			key: lanePfx + "rate.limit", want: []string{"required"}},
		{name: "rate section missing", text: laneYAML("", "rate: -"),
			key: lanePfx + "rate.limit", want: []string{"required"}},

		// Durations.
		{name: "ack_wait int 5", text: laneYAML("", "source: {stream: S, subjects: [a.>], ack_wait: 5}"),
			key: lanePfx + "source.ack_wait", want: []string{`"5" is not a duration with a unit (e.g. 5s)`}},
		{name: "ack_wait string 5", text: laneYAML("", `source: {stream: S, subjects: [a.>], ack_wait: "5"}`),
			key: lanePfx + "source.ack_wait", want: []string{`"5" is not a duration with a unit (e.g. 5s)`}},
		{name: "timeout float", text: laneYAML("", "task: {timeout: 2.5}"),
			key: lanePfx + "task.timeout", want: []string{`"2.5"`, "unit"}},
		{name: "duration junk", text: laneYAML("", "bucket: {max_age: 5 minutes}"),
			key: lanePfx + "bucket.max_age", want: []string{`"5 minutes"`, "not a duration"}},
		{name: "backoff bare number", text: laneYAML("", "task: {retry: {backoff: [1s, 5]}}"),
			key: lanePfx + "task.retry.backoff[1]", want: []string{`"5"`, "unit"}},
		{name: "backoff zero", text: laneYAML("", "task: {retry: {backoff: [0s]}}"),
			key: lanePfx + "task.retry.backoff[0]", want: []string{"0s", "> 0"}},
		{name: "backoff empty", text: laneYAML("", "task: {retry: {backoff: []}}"),
			key: lanePfx + "task.retry.backoff", want: []string{"at least one"}},
		{name: "max_delay 0s", text: laneYAML("", "task: {retry: {max_delay: 0s}}"),
			key: lanePfx + "task.retry.max_delay", want: []string{"0s"}},
		{name: "task timeout 0s", text: laneYAML("", "task: {timeout: 0s}"),
			key: lanePfx + "task.timeout", want: []string{"must be > 0", "0s"}},
		{name: "warmup -1s", text: laneYAML("", "rate: {limit: 10/s, warmup: {period: -1s}}"),
			key: lanePfx + "rate.warmup.period", want: []string{"-1s"}},
		{name: "max_age negative", text: laneYAML("", "bucket: {max_age: -1m}"),
			key: lanePfx + "bucket.max_age", want: []string{"-1m0s"}},
		{name: "drain_timeout 0s", text: laneYAML("shutdown: {drain_timeout: 0s}"),
			key: "shutdown.drain_timeout", want: []string{"0s"}},

		// Integers and numbers.
		{name: "capacity 0", text: laneYAML("", "bucket: {capacity: 0}"),
			key: lanePfx + "bucket.capacity", want: []string{"≥ 1", "got 0"}},
		{name: "capacity -5", text: laneYAML("", "bucket: {capacity: -5}"),
			key: lanePfx + "bucket.capacity", want: []string{"must be ≥ 1, got -5"}},
		{name: "capacity string", text: laneYAML("", "bucket: {capacity: lots}"),
			key: lanePfx + "bucket.capacity", want: []string{`"lots"`, "integer"}},
		{name: "capacity fraction", text: laneYAML("", "bucket: {capacity: 1.5}"),
			key: lanePfx + "bucket.capacity", want: []string{"1.5", "integer"}},
		{name: "capacity list", text: laneYAML("", "bucket: {capacity: [1]}"),
			key: lanePfx + "bucket.capacity", want: []string{"a list"}},
		{name: "max_in_flight 0", text: laneYAML("", "task: {max_in_flight: 0}"),
			key: lanePfx + "task.max_in_flight", want: []string{"got 0"}},
		{name: "max_deliver 0", text: laneYAML("", "source: {stream: S, subjects: [a.>], max_deliver: 0}"),
			key: lanePfx + "source.max_deliver", want: []string{"-1", "got 0"}},
		{name: "max_ack_pending negative", text: laneYAML("", "source: {stream: S, subjects: [a.>], max_ack_pending: -1}"),
			key: lanePfx + "source.max_ack_pending", want: []string{"got -1"}},
		{name: "max_ack_pending below max_in_flight", text: laneYAML("", "source: {stream: S, subjects: [a.>], max_ack_pending: 4}"),
			key: lanePfx + "source.max_ack_pending", want: []string{"task.max_in_flight (8)", "got 4"}},
		{name: "creds without url", text: laneYAML("nats: {creds: ./load_test.go}"),
			key: "nats.creds", want: []string{"only with nats.url"}},
		{name: "creds unreadable", text: laneYAML("nats: {url: 'nats://h:4222', creds: /nonexistent/u.creds}"),
			key: "nats.creds", want: []string{"cannot be read", "/nonexistent/u.creds"}},
		{name: "tls ca unreadable", text: laneYAML("nats: {url: 'nats://h:4222', tls: {ca_file: /nonexistent/ca.pem}}"),
			key: "nats.tls.ca_file", want: []string{"cannot be read"}},
		{name: "tls cert without key", text: laneYAML("nats: {url: 'nats://h:4222', tls: {cert_file: ./load_test.go}}"),
			key: "nats.tls.cert_file", want: []string{"go together"}},
		{name: "replicas 0", text: laneYAML("", "source: {stream: S, subjects: [a.>], replicas: 0}"),
			key: lanePfx + "source.replicas", want: []string{"1..5", "got 0"}},
		{name: "replicas 6", text: laneYAML("", "source: {stream: S, subjects: [a.>], replicas: 6}"),
			key: lanePfx + "source.replicas", want: []string{"1..5", "got 6"}},
		{name: "slack negative", text: laneYAML("", "rate: {limit: 10/s, slack: -1}"),
			key: lanePfx + "rate.slack", want: []string{"got -1"}},
		{name: "cold_factor 0.5", text: laneYAML("", "rate: {limit: 10/s, warmup: {period: 10s, cold_factor: 0.5}}"),
			key: lanePfx + "rate.warmup.cold_factor", want: []string{"≥ 1", "0.5"}},
		{name: "replicas_hint 0", text: laneYAML("redis: {replicas_hint: 0}"),
			key: "redis.replicas_hint", want: []string{"got 0"}},

		// Enumerations, booleans, strings.
		{name: "overflow drop", text: laneYAML("", "bucket: {overflow: drop}"),
			key: lanePfx + "bucket.overflow", want: []string{`"drop"`, "block or reject"}},
		{name: "max_wait with block", text: laneYAML("", "bucket: {overflow: block, max_wait: 1s}"),
			key: lanePfx + "bucket.max_wait", want: []string{"reject", "1s"}},
		{name: "fair_key subject:-1", text: laneYAML("", "bucket: {fair_key: \"subject:-1\"}"),
			key: lanePfx + "bucket.fair_key", want: []string{`"subject:-1"`, "N ≥ 0"}},
		{name: "fair_key subject:x", text: laneYAML("", "bucket: {fair_key: \"subject:x\"}"),
			key: lanePfx + "bucket.fair_key", want: []string{`"subject:x"`}},
		{name: "fair_key with a space", text: laneYAML("", "bucket: {fair_key: \"Tenant Id\"}"),
			key: lanePfx + "bucket.fair_key", want: []string{`"Tenant Id"`, "header name"}},
		{name: "retry_after yes", text: laneYAML("", "task: {retry: {retry_after: yes}}"),
			key: lanePfx + "task.retry.retry_after", want: []string{`"yes"`, "true or false"}},
		{name: "global as number", text: laneYAML("", "rate: {limit: 10/s, global: 1}"),
			key: lanePfx + "rate.global", want: []string{"1", "true or false"}},
		{name: "global without redis", text: laneYAML("", "rate: {limit: 10/s, global: true}"),
			key: lanePfx + "rate.global", want: []string{"true", "redis.addr"}},
		{name: "log level", text: laneYAML("log: {level: verbose}"),
			key: "log.level", want: []string{`"verbose"`}},
		{name: "log format", text: laneYAML("log: {format: xml}"),
			key: "log.format", want: []string{`"xml"`}},
		{name: "stream bool", text: laneYAML("", "source: {stream: true, subjects: [a.>]}"),
			key: lanePfx + "source.stream", want: []string{"true", "string"}},

		// Structure: unknown keys and mappings.
		{name: "unknown nested key", text: laneYAML("", "rate: {limt: 100/s}"),
			key: lanePfx + "rate.limt", want: []string{"unknown key"}},
		{name: "unknown deep key", text: laneYAML("", "task: {retry: {backof: [1s]}}"),
			key: lanePfx + "task.retry.backof", want: []string{"unknown key"}},
		{name: "unknown lane section", text: laneYAML("", "sourc: {stream: S}"),
			key: lanePfx + "sourc", want: []string{"unknown key"}},
		// Misspelt keys with nothing in them: viper's AllSettings leaves
		// empty mappings and nulls out (withEmptyKeys).
		{name: "unknown empty section", text: laneYAML("", "sinc: {}"),
			key: lanePfx + "sinc", want: []string{"unknown key"}},
		{name: "unknown null key", text: laneYAML("", "task: {retyr: }"),
			key: lanePfx + "task.retyr", want: []string{"unknown key"}},
		{name: "unknown empty deep key", text: laneYAML("", "task: {retry: {backof: {}}}"),
			key: lanePfx + "task.retry.backof", want: []string{"unknown key"}},
		{name: "unknown empty top-level key", text: laneYAML("admn: {}"),
			key: "admn", want: []string{"unknown key"}},
		{name: "unknown top-level key", text: laneYAML("admn: {listen: 127.0.0.1:1}"),
			key: "admn", want: []string{"unknown key"}},
		{name: "scalar for section", text: laneYAML("", "sink: log"),
			key: lanePfx + "sink", want: []string{`"log"`, "mapping"}},
		{name: "mapping for scalar", text: laneYAML("", "bucket: {capacity: {max: 5}}"),
			key: lanePfx + "bucket.capacity", want: []string{"mapping"}},
		{name: "downstreams list", text: "downstreams: [payments]\n",
			key: "downstreams", want: []string{"a list"}},
		{name: "lane names share env names", text: laneYAML("", "source: {stream: S, subjects: [a.>]}") +
			"  eu-west: {source: {stream: S, subjects: [b.>]}, rate: {limit: 1/s}, sink: {kind: log}}\n" +
			"  eu_west: {source: {stream: S, subjects: [c.>]}, rate: {limit: 1/s}, sink: {kind: log}}\n",
			key: "downstreams.eu_west", want: []string{`"eu-west"`, "SHAPER_DOWNSTREAMS_EU_WEST"}},
		{name: "nats scalar", text: laneYAML("nats: nats://127.0.0.1:4222"),
			key: "nats", want: []string{`"nats://127.0.0.1:4222"`, "mapping"}},
		{name: "no lanes", text: "downstreams: {}\n",
			key: "downstreams", want: []string{"at least one lane"}},
		{name: "lane name", text: strings.Replace(laneYAML(""), "payments:", "pay ments:", 1),
			key: "downstreams.pay ments", want: []string{`"pay ments"`, "[a-z0-9_-]+"}},

		// Source names and subjects.
		{name: "stream missing", text: laneYAML("", "source: {subjects: [a.>]}"),
			key: lanePfx + "source.stream", want: []string{"required"}},
		{name: "stream with dot", text: laneYAML("", "source: {stream: CALL.BACKS, subjects: [a.>]}"),
			key: lanePfx + "source.stream", want: []string{`"CALL.BACKS"`, `'.'`}},
		{name: "stream with space", text: laneYAML("", `source: {stream: "CALL BACKS", subjects: [a.>]}`),
			key: lanePfx + "source.stream", want: []string{`"CALL BACKS"`}},
		{name: "subjects missing", text: laneYAML("", "source: {stream: S}"),
			key: lanePfx + "source.subjects", want: []string{"at least one"}},
		{name: "subject empty token", text: laneYAML("", "source: {stream: S, subjects: [a..b]}"),
			key: lanePfx + "source.subjects[0]", want: []string{`"a..b"`}},
		{name: "subject > not last", text: laneYAML("", "source: {stream: S, subjects: [a.>.b]}"),
			key: lanePfx + "source.subjects[0]", want: []string{`"a.>.b"`, "last"}},
		{name: "subjects overlap within lane", text: laneYAML("", "source: {stream: S, subjects: [a.>, a.b]}"),
			key: lanePfx + "source.subjects[1]", want: []string{`"a.b"`, `"a.>"`}},
		{name: "consumer with dot", text: laneYAML("", "source: {stream: S, subjects: [a.>], consumer: my.consumer}"),
			key: lanePfx + "source.consumer", want: []string{`"my.consumer"`}},
		{name: "dead letter wildcard", text: laneYAML("", "dead_letter: {subject: dead.>}"),
			key: lanePfx + "dead_letter.subject", want: []string{`"dead.>"`, "wildcard"}},
		{name: "dead letters consumed again", text: laneYAML("", "source: {stream: S, subjects: [shaper.>]}"),
			key: lanePfx + "dead_letter.subject", want: []string{`"shaper.dead.payments"`, `"shaper.>"`}},

		// Sinks.
		{name: "sink kind missing", text: laneYAML("", "sink: {url: http://x}"),
			key: lanePfx + "sink.kind", want: []string{"required"}},
		{name: "sink kind kafka", text: laneYAML("", "sink: {kind: kafka}"),
			key: lanePfx + "sink.kind", want: []string{`"kafka"`}},
		{name: "http url missing", text: laneYAML("", "sink: {kind: http}"),
			key: lanePfx + "sink.url", want: []string{"required"}},
		{name: "http url without scheme", text: laneYAML("", "sink: {kind: http, url: example.com/callback}"),
			key: lanePfx + "sink.url", want: []string{`"example.com/callback"`, "no scheme"}},
		{name: "http url ftp", text: laneYAML("", "sink: {kind: http, url: ftp://example.com/x}"),
			key: lanePfx + "sink.url", want: []string{`"ftp://example.com/x"`}},
		{name: "http url without host", text: laneYAML("", "sink: {kind: http, url: 'http:///callback'}"),
			key: lanePfx + "sink.url", want: []string{`"http:///callback"`, "no host"}},
		{name: "http method", text: laneYAML("", `sink: {kind: http, url: "http://x/", method: "PO ST"}`),
			key: lanePfx + "sink.method", want: []string{`"PO ST"`}},
		{name: "success status 600", text: laneYAML("", "sink: {kind: http, url: http://x/, success_status: [2xx, 600]}"),
			key: lanePfx + "sink.success_status[1]", want: []string{`"600"`}},
		{name: "retryable status", text: laneYAML("", "sink: {kind: http, url: http://x/, retryable_status: [409, 99]}"),
			key: lanePfx + "sink.retryable_status[1]", want: []string{"99"}},
		{name: "retryable status also a success", text: laneYAML("", "sink: {kind: http, url: http://x/, success_status: [2xx], retryable_status: [404, 200]}"),
			key: lanePfx + "sink.retryable_status[1]", want: []string{"200 is also a success_status", "never retried"}},
		{name: "reserved header", text: laneYAML("", "sink: {kind: http, url: http://x/, headers: {Idempotency-Key: x}}"),
			key: lanePfx + "sink.headers.idempotency-key", want: []string{`"Idempotency-Key"`, "reserved"}},
		{name: "header value not a string", text: laneYAML("", "sink: {kind: http, url: http://x/, headers: {x-a: [1]}}"),
			key: lanePfx + "sink.headers.x-a", want: []string{"a list"}},
		{name: "nats sink without subject", text: laneYAML("", "sink: {kind: nats}"),
			key: lanePfx + "sink.subject", want: []string{"required"}},
		{name: "nats sink loops", text: laneYAML("", "sink: {kind: nats, subject: callbacks.payments.again}"),
			key: lanePfx + "sink.subject", want: []string{`"callbacks.payments.again"`, "loop"}},
		{name: "unset env in header", text: laneYAML("", "sink: {kind: http, url: http://x/, headers: {Authorization: 'Bearer ${SHAPER_TEST_UNSET_TOKEN}'}}"),
			key: lanePfx + "sink.headers.authorization", want: []string{"${SHAPER_TEST_UNSET_TOKEN}", "not set"}},
		{name: "unset env in url", text: laneYAML("", "sink: {kind: http, url: '${SHAPER_TEST_UNSET_URL}'}"),
			key: lanePfx + "sink.url", want: []string{"${SHAPER_TEST_UNSET_URL}", "not set"}},
		{name: "bad env reference", text: laneYAML("", "sink: {kind: http, url: 'http://x/${A-B}'}"),
			key: lanePfx + "sink.url", want: []string{"${A-B}"}},

		// Addresses.
		{name: "admin listen without port", text: laneYAML("admin: {listen: localhost}"),
			key: "admin.listen", want: []string{`"localhost"`, "host:port"}},
		{name: "embedded listen bad port", text: laneYAML("nats: {embedded: {listen: '127.0.0.1:99999'}}"),
			key: "nats.embedded.listen", want: []string{`"127.0.0.1:99999"`, "0-65535"}},
		{name: "nats url scheme", text: laneYAML("nats: {url: 'http://nats:4222'}"),
			key: "nats.url", want: []string{`"http://nats:4222"`, "nats, tls, ws or wss"}},
		{name: "redis addr", text: laneYAML("redis: {addr: 'redis-host'}"),
			key: "redis.addr", want: []string{`"redis-host"`, "host:port"}},
		{name: "store dir empty", text: laneYAML("nats: {embedded: {store_dir: ''}}"),
			key: "nats.embedded.store_dir", want: []string{"required"}},

		// Values from the environment are checked like values from the file.
		{name: "env duration without unit", text: laneYAML(""),
			env: map[string]string{"SHAPER_DOWNSTREAMS_PAYMENTS_SOURCE_ACK_WAIT": "90"},
			key: lanePfx + "source.ack_wait", want: []string{`"90"`, "unit"}},
		{name: "env bad rate", text: laneYAML(""),
			env: map[string]string{"SHAPER_DOWNSTREAMS_PAYMENTS_RATE_LIMIT": "0/s"},
			key: lanePfx + "rate.limit", want: []string{`"0/s"`}},
		{name: "env override below a scalar section", text: laneYAML("nats: foo"),
			env: map[string]string{"SHAPER_NATS_URL": "nats://127.0.0.1:4222"},
			key: "nats", want: []string{`"foo"`, "mapping"}},
		{name: "env override below a scalar lane section", text: laneYAML("", "task: 5s"),
			env: map[string]string{"SHAPER_DOWNSTREAMS_PAYMENTS_TASK_TIMEOUT": "1s"},
			key: lanePfx + "task", want: []string{`"5s"`, "mapping"}},
		{name: "env capacity 0", text: laneYAML(""),
			env: map[string]string{"SHAPER_DOWNSTREAMS_PAYMENTS_BUCKET_CAPACITY": "0"},
			key: lanePfx + "bucket.capacity", want: []string{"got 0"}},
	})
}

// TestCase_C12_DegenerateValuesAreErrors: the inputs of field case C12
// (spring-cloud-gateway#168, golang/go#39984, go-gitlab#1837,
// nats.net.v1#836) translated to SPEC §4 keys. Each must be an error naming
// the key and the offending value, returned at once (well within the 2 s the
// case allows the daemon to exit): Load fails before anything connects, so
// nothing is fetched and no HTTP call is made. The known-good config loads.
func TestCase_C12_DegenerateValuesAreErrors(t *testing.T) {
	runBroken(t, []brokenCase{
		// "rate: 0" — the lane's rate is rate.limit.
		{name: "rate 0", text: laneYAML("", "rate: {limit: 0}"),
			key: lanePfx + "rate.limit", want: []string{`"0"`}},
		// "rate: 0" written literally where the rate section belongs.
		{name: "rate section 0", text: laneYAML("", "rate: 0"),
			key: lanePfx + "rate", want: []string{"0", "mapping"}},
		{name: "rate -1", text: laneYAML("", "rate: {limit: -1}"),
			key: lanePfx + "rate.limit", want: []string{`"-1"`}},
		{name: "capacity 0", text: laneYAML("", "bucket: {capacity: 0}"),
			key: lanePfx + "bucket.capacity", want: []string{"got 0"}},
		// "global.burst: 0" — we have no burst (slack is the nearest knob,
		// and 0 is its valid default); a burst key is unknown, not ignored.
		{name: "global.burst 0", text: laneYAML("", "rate: {limit: 10/s, global: {burst: 0}}"),
			key: lanePfx + "rate.global", want: []string{"true or false", "mapping"}},
		{name: "burst 0", text: laneYAML("", "rate: {limit: 10/s, burst: 0}"),
			key: lanePfx + "rate.burst", want: []string{"unknown key"}},
		{name: "warmup -1s", text: laneYAML("", "rate: {limit: 10/s, warmup: {period: -1s}}"),
			key: lanePfx + "rate.warmup.period", want: []string{"-1s"}},
		{name: "task_timeout 0", text: laneYAML("", "task: {timeout: 0s}"),
			key: lanePfx + "task.timeout", want: []string{"0s"}},
		// "fetch.expires: 30s with ack_wait: 10s" — shaper sizes its fetches
		// itself; a fetch key is unknown, so the typo-or-wish is not ignored.
		{name: "fetch.expires", text: laneYAML("", "source: {stream: S, subjects: [a.>], ack_wait: 10s, fetch: {expires: 30s}}"),
			key: lanePfx + "source.fetch", want: []string{"unknown key"}},
		// ack_wait ≤ task.timeout is not degenerate: a running task keeps
		// its message with in-progress acks (SPEC G7, issue 13); it is a
		// warning (TestLoad_AckWaitBelowTimeout).
		{name: "missing downstream URL", text: laneYAML("", "sink: {kind: http}"),
			key: lanePfx + "sink.url", want: []string{"required"}},
		{name: "unknown YAML key", text: laneYAML("", "bucket: {capacity: 10, overflw: reject}"),
			key: lanePfx + "bucket.overflw", want: []string{"unknown key"}},
	})

	t.Run("known good", func(t *testing.T) {
		start := time.Now()
		c, warns := mustLoad(t, laneYAML(""))
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Load took %v", d)
		}
		if len(warns) != 0 || c.Downstreams["payments"].Rate.Limit != 100 {
			t.Errorf("warnings %v, lane %+v", warns, c.Downstreams["payments"])
		}
	})
}

func TestLoad_ReportsEveryProblemAtOnce(t *testing.T) {
	text := `
log: {level: loud}
nats: {embeded: {listen: 127.0.0.1:4222}}
downstreams:
  payments:
    source: {stream: CALLBACKS, subjects: [callbacks.>], ack_wait: 5}
    bucket: {capacity: -5, overflow: drop}
    rate: {limt: 100/s}
    task: {timeout: 0s}
    sink: {kind: http, url: example.com}
  refunds:
    source: {stream: CALLBACKS, subjects: [callbacks.refunds.>]}
    rate: {limit: 0/s}
    sink: {kind: log}
`
	err := loadErr(t, text)
	want := map[string]string{
		"log.level":                            `"loud"`,
		"nats.embeded":                         "unknown key",
		"downstreams.payments.source.ack_wait": `"5"`,
		"downstreams.payments.bucket.capacity": "-5",
		"downstreams.payments.bucket.overflow": `"drop"`,
		"downstreams.payments.rate.limt":       "unknown key",
		"downstreams.payments.rate.limit":      "required",
		"downstreams.payments.task.timeout":    "0s",
		"downstreams.payments.sink.url":        `"example.com"`,
		// The overlap is reported once, on the lane that comes second.
		"downstreams.refunds.source.subjects[0]": `"callbacks.>"`,
		"downstreams.refunds.rate.limit":         `"0/s"`,
	}
	for key, val := range want {
		requireProblem(t, err, key, val)
	}
	fes := fieldErrors(t, err)
	if len(fes) != len(want) {
		t.Errorf("got %d problems, want %d:\n%v", len(fes), len(want), err)
	}
	if lines := strings.Split(err.Error(), "\n"); len(lines) != len(fes) {
		t.Errorf("want one problem per line, got %d lines for %d problems", len(lines), len(fes))
	}
	if !slices.IsSortedFunc(fes, func(a, b *config.FieldError) int { return strings.Compare(a.Key, b.Key) }) {
		t.Errorf("problems are not sorted by key:\n%v", err)
	}
}

func TestLoad_Defaults(t *testing.T) {
	c, warns := mustLoad(t, laneYAML(""))
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	if c.NATS.URL != "" || c.NATS.Embedded.Listen != "127.0.0.1:4222" || c.NATS.Embedded.StoreDir != "./data/nats" {
		t.Errorf("nats = %+v", c.NATS)
	}
	if c.Admin.Listen != "127.0.0.1:9464" || c.Log.Level != "info" || c.Log.Format != "text" {
		t.Errorf("admin %+v log %+v", c.Admin, c.Log)
	}
	if c.Shutdown.DrainTimeout != 30*time.Second || c.Redis.Addr != "" || c.Redis.ReplicasHint != 1 {
		t.Errorf("shutdown %+v redis %+v", c.Shutdown, c.Redis)
	}
	l := c.Downstreams["payments"]
	checks := []struct {
		key      string
		got, exp any
	}{
		{"source.stream", l.Source.Stream, "CALLBACKS"},
		{"source.subjects", fmt.Sprint(l.Source.Subjects), "[callbacks.payments.>]"},
		{"source.consumer", l.Source.Consumer, "shaper-payments"},
		{"source.ack_wait", l.Source.AckWait, 60 * time.Second},
		{"source.max_deliver", l.Source.MaxDeliver, 5},
		{"source.replicas", l.Source.Replicas, 1},
		{"source.max_ack_pending", l.Source.MaxAckPending, 0},
		{"bucket.capacity", l.Bucket.Capacity, 1000},
		{"bucket.overflow", l.Bucket.Overflow, "block"},
		{"bucket.max_wait", l.Bucket.MaxWait, time.Duration(0)},
		{"bucket.max_age", l.Bucket.MaxAge, time.Duration(0)},
		{"bucket.fair_key", l.Bucket.FairKey, ""},
		{"rate.limit", l.Rate.Limit, shaper.Limit(100)},
		{"rate.slack", l.Rate.Slack, 0},
		{"rate.warmup.period", l.Rate.Warmup.Period, time.Duration(0)},
		{"rate.warmup.cold_factor", l.Rate.Warmup.ColdFactor, 3.0},
		{"rate.global", l.Rate.Global, false},
		{"task.timeout", l.Task.Timeout, 5 * time.Second},
		{"task.max_in_flight", l.Task.MaxInFlight, 8},
		{"task.retry.backoff", fmt.Sprint(l.Task.Retry.Backoff), "[1s 5s 30s]"},
		{"task.retry.retry_after", l.Task.Retry.RetryAfter, true},
		{"task.retry.max_delay", l.Task.Retry.MaxDelay, 5 * time.Minute},
		{"dead_letter.subject", l.DeadLetter.Subject, "shaper.dead.payments"},
		{"sink.kind", l.Sink.Kind, "log"},
		{"sink.method", l.Sink.Method, "POST"},
		{"sink.success_status", fmt.Sprint(l.Sink.SuccessStatus), "[2xx]"},
	}
	for _, ck := range checks {
		if ck.got != ck.exp {
			t.Errorf("%s = %v, want %v", ck.key, ck.got, ck.exp)
		}
	}
}

// TestLoad_DefaultsApplyToEveryLane checks that per-lane defaults reach
// every lane of the map, and that explicit values (including a valid 0)
// are kept rather than replaced by the default.
func TestLoad_DefaultsApplyToEveryLane(t *testing.T) {
	c, _ := mustLoad(t, `
downstreams:
  a:
    source: {stream: S, subjects: [a.>], consumer: ""}
    rate: {limit: 1/s}
    sink: {kind: log}
  b-lane:
    source: {stream: S, subjects: [b.>], consumer: custom, max_deliver: -1}
    bucket: {capacity: 7, overflow: reject, max_wait: 0s}
    rate: {limit: 6000/m, slack: 0, warmup: {period: 1m}}
    task: {retry: {retry_after: false, backoff: [2s]}}
    dead_letter: {subject: dead.b}
    sink: {kind: http, url: "http://127.0.0.1:8080/", success_status: [200, 204]}
`)
	a, b := c.Downstreams["a"], c.Downstreams["b-lane"]
	if a.Bucket.Capacity != 1000 || a.Source.Consumer != "shaper-a" || a.DeadLetter.Subject != "shaper.dead.a" ||
		a.Task.MaxInFlight != 8 || !a.Task.Retry.RetryAfter || a.Rate.Warmup.ColdFactor != 3 {
		t.Errorf("lane a did not get the defaults: %+v", a)
	}
	if b.Bucket.Capacity != 7 || b.Bucket.Overflow != "reject" || b.Source.Consumer != "custom" ||
		b.Source.MaxDeliver != -1 || b.Task.Retry.RetryAfter || fmt.Sprint(b.Task.Retry.Backoff) != "[2s]" ||
		b.DeadLetter.Subject != "dead.b" || b.Rate.Limit != 100 || b.Rate.Warmup.Period != time.Minute ||
		b.Rate.Warmup.ColdFactor != 3 || fmt.Sprint(b.Sink.SuccessStatus) != "[200 204]" ||
		b.Task.Timeout != 5*time.Second || b.Source.AckWait != time.Minute {
		t.Errorf("lane b-lane = %+v", b)
	}
}

// TestLoad_EmptyKnownSections: a known section left empty or null is the
// defaults, not an error (withEmptyKeys adds such keys back only for the
// unknown-key check).
func TestLoad_EmptyKnownSections(t *testing.T) {
	c, _ := mustLoad(t, laneYAML("log: {}\nadmin:\n", "bucket: {}", "dead_letter: ", "task: {retry: {}}"))
	if got := c.Downstreams["payments"].Bucket.Capacity; got != 1000 {
		t.Errorf("bucket.capacity = %d with an empty bucket section, want the default 1000", got)
	}
}

func TestLoad_Rates(t *testing.T) {
	for _, tc := range []struct {
		text string
		want shaper.Limit
	}{
		{"100/s", 100}, {"6000/m", 100}, {"7200/h", 2}, {"100", 100}, {"0.5", 0.5}, {"0.5/s", 0.5}, {`"250"`, 250},
	} {
		c, _ := mustLoad(t, laneYAML("", "rate: {limit: "+tc.text+"}"))
		if got := c.Downstreams["payments"].Rate.Limit; got != tc.want {
			t.Errorf("limit %s = %v, want %v", tc.text, got, tc.want)
		}
	}
}

// A zero duration needs no unit: "0" and 0 cannot be misread as anything
// else, so they are accepted (only a non-zero bare number is ambiguous).
func TestLoad_ZeroDurationWithoutUnit(t *testing.T) {
	c, _ := mustLoad(t, laneYAML("", `bucket: {max_wait: 0, max_age: "0"}`))
	if l := c.Downstreams["payments"]; l.Bucket.MaxWait != 0 || l.Bucket.MaxAge != 0 {
		t.Errorf("bucket = %+v", l.Bucket)
	}
}

func TestLoad_EnvOverridesFile(t *testing.T) {
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_RATE_LIMIT", "200/s")
	c, _ := mustLoad(t, laneYAML("", "rate: {limit: 100/s}"))
	if got := c.Downstreams["payments"].Rate.Limit; got != 200 {
		t.Errorf("rate.limit = %v, want 200/s from the environment", got)
	}
}

// TestLoad_EnvMisspeltWarns: an override that matches no key (a typo, or a
// lane the file lacks) is reported, not silently ignored; a variable the
// file references as ${NAME} is not.
func TestLoad_EnvMisspeltWarns(t *testing.T) {
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_TASK_RETYR", "1")
	t.Setenv("SHAPER_DOWNSTREAMS_ORDERS_RATE_LIMIT", "5/s")
	t.Setenv("SHAPER_PAYMENTS_TOKEN", "secret")
	_, warns := mustLoad(t, laneYAML("", `sink: {kind: http, url: "http://x/", headers: {Authorization: "Bearer ${SHAPER_PAYMENTS_TOKEN}"}}`))
	got := map[string]bool{}
	for _, w := range warns {
		got[w.Key] = true
	}
	for _, name := range []string{"SHAPER_DOWNSTREAMS_PAYMENTS_TASK_RETYR", "SHAPER_DOWNSTREAMS_ORDERS_RATE_LIMIT"} {
		if !got[name] {
			t.Errorf("no warning for %s (warnings %v)", name, warns)
		}
	}
	if got["SHAPER_PAYMENTS_TOKEN"] {
		t.Error("a ${ENV} secret was reported as an unknown override")
	}
}

// TestLoad_EnvNestedKeys overrides keys the file does not mention, at every
// depth, in a lane whose name has a dash, and list values.
func TestLoad_EnvNestedKeys(t *testing.T) {
	t.Setenv("SHAPER_DOWNSTREAMS_EU_WEST_TASK_RETRY_MAX_DELAY", "90s")
	t.Setenv("SHAPER_DOWNSTREAMS_EU_WEST_SOURCE_ACK_WAIT", "2m")
	t.Setenv("SHAPER_DOWNSTREAMS_EU_WEST_RATE_WARMUP_PERIOD", "30s")
	t.Setenv("SHAPER_DOWNSTREAMS_EU_WEST_BUCKET_CAPACITY", "50")
	t.Setenv("SHAPER_DOWNSTREAMS_EU_WEST_TASK_RETRY_BACKOFF", "2s, 4s")
	t.Setenv("SHAPER_DOWNSTREAMS_EU_WEST_SOURCE_SUBJECTS", "eu.a,eu.b")
	t.Setenv("SHAPER_DOWNSTREAMS_EU_WEST_TASK_RETRY_RETRY_AFTER", "false")
	t.Setenv("SHAPER_DOWNSTREAMS_EU_WEST_SINK_HEADERS_X_TEAM", "blue")
	t.Setenv("SHAPER_LOG_LEVEL", "debug")
	t.Setenv("SHAPER_SHUTDOWN_DRAIN_TIMEOUT", "10s")
	t.Setenv("SHAPER_NATS_EMBEDDED_LISTEN", "127.0.0.1:0")
	c, _ := mustLoad(t, `
downstreams:
  eu-west:
    source: {stream: EU, subjects: [eu.>]}
    rate: {limit: 10/s}
    sink: {kind: http, url: "http://127.0.0.1/", headers: {X-Team: red}}
`)
	l := c.Downstreams["eu-west"]
	if l.Task.Retry.MaxDelay != 90*time.Second || l.Source.AckWait != 2*time.Minute ||
		l.Rate.Warmup.Period != 30*time.Second || l.Bucket.Capacity != 50 ||
		fmt.Sprint(l.Task.Retry.Backoff) != "[2s 4s]" || fmt.Sprint(l.Source.Subjects) != "[eu.a eu.b]" ||
		l.Task.Retry.RetryAfter || l.Sink.Headers["x-team"] != "blue" {
		t.Errorf("lane = %+v", l)
	}
	if c.Log.Level != "debug" || c.Shutdown.DrainTimeout != 10*time.Second || c.NATS.Embedded.Listen != "127.0.0.1:0" {
		t.Errorf("log %+v shutdown %+v nats %+v", c.Log, c.Shutdown, c.NATS)
	}
}

func TestLoad_FlagsOverrideEnvAndFile(t *testing.T) {
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_RATE_LIMIT", "200/s")
	t.Setenv("SHAPER_LOG_LEVEL", "debug")
	flags := pflag.NewFlagSet("shaper", pflag.ContinueOnError)
	flags.StringP("config", "c", "", "config file")
	flags.String("downstreams.payments.rate.limit", "", "")
	flags.String("log-level", "", "")
	flags.String("log.format", "json", "not set on the command line: must not override")
	flags.Int("downstreams.payments.bucket.capacity", 0, "")
	flags.Duration("shutdown.drain_timeout", 0, "")
	if err := flags.Parse([]string{"-c", "x.yaml", "--downstreams.payments.rate.limit=300/s", "--log-level=warn",
		"--downstreams.payments.bucket.capacity=20", "--shutdown.drain_timeout=45s"}); err != nil {
		t.Fatal(err)
	}
	flags.String("downstreams.nope.rate.limit", "", "a lane that is not in the file")
	if err := flags.Set("downstreams.nope.rate.limit", "1/s"); err != nil {
		t.Fatal(err)
	}
	c, warns, err := config.Load(writeConfig(t, laneYAML("log: {format: text}")), flags)
	if err != nil {
		t.Fatal(err)
	}
	requireWarning(t, warns, "--downstreams.nope.rate.limit", "ignored")
	l := c.Downstreams["payments"]
	if l.Rate.Limit != 300 || l.Bucket.Capacity != 20 || c.Log.Level != "warn" || c.Log.Format != "text" ||
		c.Shutdown.DrainTimeout != 45*time.Second {
		t.Errorf("limit %v capacity %d log %+v drain %v", l.Rate.Limit, l.Bucket.Capacity, c.Log, c.Shutdown.DrainTimeout)
	}
}

func TestLoad_RepositoryConfig(t *testing.T) {
	c, warns, err := config.Load("../config.yaml", nil)
	if err != nil {
		t.Fatalf("../config.yaml: %v", err)
	}
	if len(warns) != 0 {
		t.Errorf("../config.yaml: warnings %v", warns)
	}
	l, ok := c.Downstreams["payments"]
	if !ok || len(c.Downstreams) != 1 {
		t.Fatalf("lanes = %v, want payments", c.Downstreams)
	}
	if c.NATS.URL != "" || c.NATS.Embedded.Listen != "127.0.0.1:4222" || c.NATS.Embedded.StoreDir != "./data/nats" ||
		c.Admin.Listen != "127.0.0.1:9464" {
		t.Errorf("not a fresh-machine setup: nats %+v admin %+v", c.NATS, c.Admin)
	}
	if l.Source.Stream != "CALLBACKS" || fmt.Sprint(l.Source.Subjects) != "[callbacks.payments.>]" ||
		l.Rate.Limit != 100 || l.Bucket.Capacity != 1000 || l.Sink.Kind != "log" {
		t.Errorf("payments = %+v", l)
	}
	if w, err := config.Validate(c); err != nil || len(w) != 0 {
		t.Errorf("Validate: %v %v", w, err)
	}
}

func TestLoad_SpecExample(t *testing.T) {
	c, warns, err := config.Load("testdata/spec.yaml", nil)
	if err != nil || len(warns) != 0 {
		t.Fatalf("SPEC §4 example: warnings %v, error %v", warns, err)
	}
	if l := c.Downstreams["payments"]; l.Sink.Kind != "http" || l.Sink.URL != "http://127.0.0.1:8080/callback" {
		t.Errorf("payments sink = %+v", l.Sink)
	}
}

func TestLoad_MissingFile(t *testing.T) {
	t.Run("explicit", func(t *testing.T) {
		_, _, err := config.Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("err = %v, want fs.ErrNotExist", err)
		}
	})
	t.Run("default absent", func(t *testing.T) {
		t.Chdir(t.TempDir())
		_, warns, err := config.Load("", nil)
		requireProblem(t, err, "downstreams", "at least one lane")
		if len(warns) != 1 || warns[0].Key != "config" || !strings.Contains(warns[0].Message, "config.yaml") {
			t.Errorf("warnings = %v", warns)
		}
	})
	t.Run("default present", func(t *testing.T) {
		dir := filepath.Dir(writeConfig(t, laneYAML("")))
		t.Chdir(dir)
		if _, _, err := config.Load("", nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("not yaml", func(t *testing.T) {
		_, _, err := config.Load(writeConfig(t, "downstreams: [\n"), nil)
		if err == nil || !strings.Contains(err.Error(), "config.yaml") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestLoad_ExpandsEnvReferences(t *testing.T) {
	t.Setenv("SHAPER_TEST_TOKEN", "tok-123")
	t.Setenv("SHAPER_TEST_HOST", "127.0.0.1:8080")
	t.Setenv("SHAPER_TEST_REDIS", "127.0.0.1:6379")
	c, _ := mustLoad(t, laneYAML("redis: {addr: '${SHAPER_TEST_REDIS}'}",
		"rate: {limit: 10/s, global: true}",
		`sink: {kind: http, url: "http://${SHAPER_TEST_HOST}/cb", headers: {Authorization: "Bearer ${SHAPER_TEST_TOKEN}", X-Plain: plain}}`))
	s := c.Downstreams["payments"].Sink
	if s.URL != "http://127.0.0.1:8080/cb" || s.Headers["authorization"] != "Bearer tok-123" || s.Headers["x-plain"] != "plain" {
		t.Errorf("sink = %+v", s)
	}
	if c.Redis.Addr != "127.0.0.1:6379" {
		t.Errorf("redis.addr = %q", c.Redis.Addr)
	}
}

// TestLoad_SecretsNeverInErrors makes every secret-bearing key fail
// validation with a value from ${ENV}: no message may contain the value.
func TestLoad_SecretsNeverInErrors(t *testing.T) {
	const secret = "hunter2-SECRET"
	t.Setenv("SHAPER_TEST_SINK_URL", "ftp://user:"+secret+"@example.com/"+secret)
	t.Setenv("SHAPER_TEST_TOKEN", secret+"\x01")
	t.Setenv("SHAPER_TEST_REDIS", "redis-"+secret)
	t.Setenv("SHAPER_TEST_NATS", "http://"+secret+"@nats:4222")
	text := laneYAML("redis: {addr: '${SHAPER_TEST_REDIS}'}\nnats: {url: '${SHAPER_TEST_NATS}'}",
		`sink: {kind: http, url: "${SHAPER_TEST_SINK_URL}", headers: {Authorization: "Bearer ${SHAPER_TEST_TOKEN}", X-Missing: "${SHAPER_TEST_UNSET_SECRET}"}}`)
	c, warns, err := config.Load(writeConfig(t, text), nil)
	if err == nil || c != nil {
		t.Fatalf("Load: err %v", err)
	}
	for _, key := range []string{"redis.addr", "nats.url", lanePfx + "sink.url", lanePfx + "sink.headers.authorization", lanePfx + "sink.headers.x-missing"} {
		requireProblem(t, err, key)
	}
	requireProblem(t, err, lanePfx+"sink.url", "${SHAPER_TEST_SINK_URL}")
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks the secret:\n%v", err)
	}
	for _, w := range warns {
		if strings.Contains(w.String(), secret) {
			t.Errorf("warning leaks the secret: %v", w)
		}
	}
}

func TestConfig_Redacted(t *testing.T) {
	const secret = "s3cr3t-value"
	t.Setenv("SHAPER_TEST_TOKEN", secret)
	t.Setenv("SHAPER_TEST_URL", "https://user:"+secret+"@example.com/cb")
	c, _ := mustLoad(t, laneYAML("nats: {url: 'nats://u:literal-pw@127.0.0.1:4222'}",
		`sink: {kind: http, url: "${SHAPER_TEST_URL}", headers: {Authorization: "Bearer ${SHAPER_TEST_TOKEN}", X-Api-Key: literal-key, Accept: application/json}}`))
	r := c.Redacted()
	dump := fmt.Sprintf("%+v", *r)
	for _, leak := range []string{secret, "literal-pw", "literal-key"} {
		if strings.Contains(dump, leak) {
			t.Errorf("Redacted shows %q: %s", leak, dump)
		}
	}
	rs := r.Downstreams["payments"].Sink
	if rs.URL != "${SHAPER_TEST_URL}" || rs.Headers["authorization"] != "Bearer ${SHAPER_TEST_TOKEN}" ||
		rs.Headers["accept"] != "application/json" {
		t.Errorf("redacted sink = %+v", rs)
	}
	if s := c.Downstreams["payments"].Sink; s.Headers["authorization"] != "Bearer "+secret || !strings.Contains(s.URL, secret) {
		t.Errorf("Redacted modified the original: %+v", s)
	}
	if (*config.Config)(nil).Redacted() != nil {
		t.Error("nil.Redacted() != nil")
	}
}

func TestLoad_Warnings(t *testing.T) {
	t.Run("G7 worst-case wait", func(t *testing.T) {
		// 1000 / 10/s + 5s = 1m45s > ack_wait 60s.
		_, warns := mustLoad(t, laneYAML("", "rate: {limit: 10/s}"))
		requireWarning(t, warns, lanePfx+"source.ack_wait", "1m0s", "1m45s", "capacity 1000", "10/s")
	})
	t.Run("G7 fits without warmup", func(t *testing.T) {
		// 5000 / 100/s + 5s = 55s < 60s.
		_, warns := mustLoad(t, laneYAML("", "bucket: {capacity: 5000}", "rate: {limit: 100/s}"))
		if len(warns) != 0 {
			t.Errorf("warnings = %v", warns)
		}
	})
	t.Run("G7 cold rate with warmup", func(t *testing.T) {
		// 5000 / (100/s / 3) + 5s = 2m35s > 60s.
		_, warns := mustLoad(t, laneYAML("", "bucket: {capacity: 5000}", "rate: {limit: 100/s, warmup: {period: 10s}}"))
		requireWarning(t, warns, lanePfx+"source.ack_wait", "1m0s", "2m35s", "cold rate 33.33/s")
	})
	t.Run("ignored sink keys", func(t *testing.T) {
		_, warns := mustLoad(t, laneYAML("", "sink: {kind: log, url: http://x/}"))
		requireWarning(t, warns, lanePfx+"sink.url", "ignored")
	})
	t.Run("returned with errors", func(t *testing.T) {
		_, warns, err := config.Load(writeConfig(t, laneYAML("", "rate: {limit: 10/s}", "bucket: {overflow: drop}")), nil)
		requireProblem(t, err, lanePfx+"bucket.overflow", "drop")
		requireWarning(t, warns, lanePfx+"source.ack_wait", "1m45s")
	})
	t.Run("G7 not from a value reported wrong", func(t *testing.T) {
		// cold_factor 0.5 is a problem: a warning on the worst-case wait
		// would quote the value already reported, or a default in its place.
		_, warns, err := config.Load(writeConfig(t, laneYAML("", "rate: {limit: 10/s, warmup: {period: 10s, cold_factor: 0.5}}")), nil)
		requireProblem(t, err, lanePfx+"rate.warmup.cold_factor", "0.5")
		for _, w := range warns {
			if w.Key == lanePfx+"source.ack_wait" {
				t.Errorf("warning %v, from a rate already reported wrong", w)
			}
		}
	})
}

func requireWarning(t *testing.T, warns []config.Warning, key string, want ...string) {
	t.Helper()
	for _, w := range warns {
		s := w.String()
		if w.Key != key || !strings.HasPrefix(s, key+": warning: ") {
			continue
		}
		ok := true
		for _, x := range want {
			ok = ok && strings.Contains(w.Message, x)
		}
		if ok {
			return
		}
	}
	t.Errorf("no warning %q with %q in %v", key, want, warns)
}

func TestValidate(t *testing.T) {
	c, _ := mustLoad(t, laneYAML(""))
	if w, err := config.Validate(c); err != nil || len(w) != 0 {
		t.Fatalf("Validate(loaded) = %v, %v", w, err)
	}
	l := c.Downstreams["payments"]
	l.Bucket.Capacity = 0
	l.Rate.Limit = 0
	l.Task.MaxInFlight = -1
	c.Downstreams["payments"] = l
	c.Log.Format = "yaml"
	_, err := config.Validate(c)
	requireProblem(t, err, lanePfx+"bucket.capacity", "got 0")
	requireProblem(t, err, lanePfx+"rate.limit", "required")
	requireProblem(t, err, lanePfx+"task.max_in_flight", "got -1")
	requireProblem(t, err, "log.format", `"yaml"`)
	if n := len(fieldErrors(t, err)); n != 4 {
		t.Errorf("%d problems, want 4:\n%v", n, err)
	}
	if _, err := config.Validate(nil); err == nil {
		t.Error("Validate(nil) = nil error")
	}
	if _, err := config.Validate(&config.Config{}); err == nil {
		t.Error("Validate(zero Config) = nil error")
	}
}

func TestWarning_String(t *testing.T) {
	w := config.Warning{Key: "downstreams.a.source.ack_wait", Message: "short"}
	if got := w.String(); got != "downstreams.a.source.ack_wait: warning: short" {
		t.Errorf("String() = %q", got)
	}
	fe := &config.FieldError{Key: "log.level", Message: `must be debug, info, warn or error, got "x"`}
	if got := fe.Error(); got != `log.level: must be debug, info, warn or error, got "x"` {
		t.Errorf("Error() = %q", got)
	}
}

func TestEnvName(t *testing.T) {
	for key, want := range map[string]string{
		"downstreams.payments.rate.limit":     "SHAPER_DOWNSTREAMS_PAYMENTS_RATE_LIMIT",
		"downstreams.eu-west.source.ack_wait": "SHAPER_DOWNSTREAMS_EU_WEST_SOURCE_ACK_WAIT",
		"log.level":                           "SHAPER_LOG_LEVEL",
	} {
		if got := config.EnvName(key); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestLane_EffectiveMaxAckPending(t *testing.T) {
	var l config.Lane
	l.Bucket.Capacity, l.Task.MaxInFlight = 100, 8
	l.Bucket.Overflow = config.OverflowBlock
	if got := l.EffectiveMaxAckPending(); got != 108 {
		t.Errorf("block: %d, want 108", got)
	}
	l.Bucket.Overflow = config.OverflowReject
	if got := l.EffectiveMaxAckPending(); got != 200 {
		t.Errorf("reject: %d, want 200", got)
	}
	l.Source.MaxAckPending = 7
	if got := l.EffectiveMaxAckPending(); got != 7 {
		t.Errorf("explicit: %d, want 7", got)
	}
}

// TestLoad_CaseClash: lanes (or keys) that differ only in case are an error,
// not a silent merge (viper folds keys to lower case).
func TestLoad_CaseClash(t *testing.T) {
	err := loadErr(t, `
downstreams:
  Payments:
    source: {stream: C, subjects: [c.>]}
    rate: {limit: 10/s}
    sink: {kind: log}
  payments:
    source: {stream: D, subjects: [d.>]}
    rate: {limit: 10/s, LIMIT: 5/s}
    sink: {kind: log}
`)
	for _, want := range []string{`downstreams.payments: keys "Payments" and "payments" differ only in case`,
		`downstreams.payments.rate.limit: keys "limit" and "LIMIT" differ only in case`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
	}
}

// TestLoad_EmptyFileIsAnError: C31 — a config file caught between the
// truncate and the write of a truncate-then-write is empty: Load says so
// and returns no configuration, never one of defaults.
func TestLoad_EmptyFileIsAnError(t *testing.T) {
	for _, text := range []string{"", "  \n\t\n"} {
		err := loadErr(t, text)
		if !strings.Contains(err.Error(), "is empty") {
			t.Errorf("Load(%q): %v, want an error saying the file is empty", text, err)
		}
	}
}

// TestLoad_DottedLaneName: a lane name with a dot is one problem, named by
// its key; viper's lane of the part before the dot ("pay", with a key "v2")
// is not reported too (a new-user pass found twenty problems of that
// phantom lane under the real one). A lane the file does name "pay" is
// still checked.
func TestLoad_DottedLaneName(t *testing.T) {
	err := loadErr(t, `
downstreams:
  pay.v2:
    source: {stream: C, subjects: [c.>]}
    rate: {limit: 10/s}
    sink: {kind: log}
`)
	if err == nil {
		t.Fatal("a dotted lane name loaded")
	}
	want := `downstreams.pay.v2: lane name must match [a-z0-9_-]+, got "pay.v2"`
	if lines := strings.Split(strings.TrimSpace(err.Error()), "\n"); len(lines) != 1 || lines[0] != want {
		t.Errorf("error:\n%v\nwant the one line %q", err, want)
	}

	err = loadErr(t, `
downstreams:
  pay.v2:
    source: {stream: C, subjects: [c.>]}
    rate: {limit: 10/s}
    sink: {kind: log}
  pay:
    source: {stream: D, subjects: [d.>]}
    sink: {kind: log}
`)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "downstreams.pay.rate.limit: required") {
		t.Errorf("error:\n%v\nwant %q and the real lane pay's missing rate.limit", err, want)
	}
}

// TestLoad_NATSURLPort: a port outside 1..65535 in nats.url is a problem
// named by its key (it passed validate and failed only at the dial, a
// new-user pass); the password is not shown.
func TestLoad_NATSURLPort(t *testing.T) {
	err := loadErr(t, `
nats: {url: "nats://u:Pw5ecret@host:99999"}
downstreams:
  pay:
    source: {stream: C, subjects: [c.>]}
    rate: {limit: 10/s}
    sink: {kind: log}
`)
	if err == nil || !strings.Contains(err.Error(), "nats.url:") || !strings.Contains(err.Error(), "port must be 1..65535") ||
		strings.Contains(err.Error(), "Pw5ecret") {
		t.Errorf("error %v, want nats.url's port named, without the password", err)
	}
}

// TestLoad_SecretsOptional: for a command that reaches no server (shaper
// simulate), an unset ${NAME} in a secret key is a warning naming the key
// and the variable, and the key's own rules (a URL that must parse) are not
// judged on the ${NAME} text; a malformed reference is still a problem, and
// without the option the unset one is too (rule 7).
func TestLoad_SecretsOptional(t *testing.T) {
	text := laneYAML("", `sink: {kind: http, url: "${SHAPER_TEST_UNSET_URL}", headers: {Authorization: "Bearer ${SHAPER_TEST_UNSET_TOKEN}"}}`)
	path := writeConfig(t, text)
	c, warns, err := config.Load(path, nil, config.SecretsOptional())
	if err != nil {
		t.Fatalf("Load with SecretsOptional: %v", err)
	}
	if got := c.Downstreams["payments"].Rate.Limit; got.Interval() <= 0 {
		t.Errorf("rate.limit %v: the lane's rules did not load", got)
	}
	for _, key := range []string{lanePfx + "sink.url", lanePfx + "sink.headers.authorization"} {
		found := false
		for _, w := range warns {
			if w.Key == key && strings.Contains(w.Message, "${SHAPER_TEST_UNSET_") && strings.Contains(w.Message, "left unexpanded") {
				found = true
			}
		}
		if !found {
			t.Errorf("no warning for %s: %v", key, warns)
		}
	}
	if _, _, err := config.Load(path, nil); err == nil {
		t.Error("Load without the option: no error for the unset variables")
	} else {
		requireProblem(t, err, lanePfx+"sink.url", "${SHAPER_TEST_UNSET_URL}")
	}
	bad := writeConfig(t, laneYAML("", `sink: {kind: http, url: "http://${1BAD}/cb"}`))
	if _, _, err := config.Load(bad, nil, config.SecretsOptional()); err == nil {
		t.Error("a malformed reference loaded with SecretsOptional")
	} else {
		requireProblem(t, err, lanePfx+"sink.url")
	}
}

// TestLoad_BadLaneNameBesideBadValues: a lane name that breaks the pattern
// is listed also when values of that lane fail to load (a rate of 0, an
// ack_wait without a unit), so every problem shows at once (found by a
// new-user pass: the name's problem appeared only after the rate was fixed).
func TestLoad_BadLaneNameBesideBadValues(t *testing.T) {
	err := loadErr(t, `
downstreams:
  "bad lane!":
    source: {stream: C, subjects: [c.>], ack_wait: 5}
    rate: {limit: 0}
    sink: {kind: log}
`)
	requireProblem(t, err, "downstreams.bad lane!", "lane name must match")
	requireProblem(t, err, "downstreams.bad lane!.rate.limit")
	requireProblem(t, err, "downstreams.bad lane!.source.ack_wait")
}

// TestLoad_UnexpandedReference: a ${NAME} in a key that does not expand
// references (only the keys that may hold secrets do) is a warning naming
// the key, since the value is used as written (found by a new-user pass: a
// stream would have been named "${STREAM}"); the secret keys warn nothing.
func TestLoad_UnexpandedReference(t *testing.T) {
	t.Setenv("SHAPER_TEST_STREAM", "S")
	t.Setenv("SHAPER_TEST_SINK_URL", "https://psp.example/cb")
	_, warns := mustLoad(t, laneYAML("", `source: {stream: "${SHAPER_TEST_STREAM}", subjects: ["a.>", "b.${SHAPER_TEST_STREAM}"]}`,
		`sink: {kind: http, url: "${SHAPER_TEST_SINK_URL}"}`))
	want := map[string]bool{lanePfx + "source.stream": false, lanePfx + "source.subjects[1]": false}
	for _, w := range warns {
		if _, ok := want[w.Key]; ok && strings.Contains(w.Message, "${SHAPER_TEST_STREAM} is not expanded in this key") {
			want[w.Key] = true
		}
		if strings.Contains(w.Key, "sink.url") {
			t.Errorf("a warning on a key that expands references: %s", w)
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("no warning for %s: %v", k, warns)
		}
	}
}
