package config_test

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/shaper-dev/shaper/config"
)

// TestLoad_YAMLErrorLine: issue 12 — a YAML syntax error is reported at the
// line of the problem, not at the line where the enclosing mapping starts
// (line 1 or 2 here, as viper's parser reported it).
func TestLoad_YAMLErrorLine(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		line       string
	}{
		{"bad indentation on line 4", "downstreams:\n  payments:\n    source: {stream: S, subjects: [a.>]}\n   rate: {limit: 1/s}\n", "line 4:"},
		{"a sequence item among keys on line 4", "downstreams:\n  payments:\n    source: {stream: S, subjects: [a.>]}\n    - rate: 1\n", "line 4:"},
		{"a tab on line 4", "log:\n  level: info\ndownstreams:\n\tpayments: {}\n", "line 4:"},
		{"an unclosed flow mapping on line 4", "log:\n  level: info\ndownstreams:\n  payments: {source: {stream: S}, rate: {limit: 1/s}\n", "line 4:"},
		{"an unclosed flow sequence on line 4", "nats:\n  url: \"\"\nlog:\n  level: [info\ndownstreams: {}\n", "starts on line 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := config.Load(writeConfig(t, tc.text), nil)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.line) {
				t.Errorf("error %q does not name %q", err, tc.line)
			}
			for _, wrong := range []string{"line 1:", "line 2:", "line 3:"} {
				if strings.Contains(err.Error(), wrong) {
					t.Errorf("error %q names %s", err, wrong)
				}
			}
		})
	}
}

// TestLoad_ProblemNamesItsOrigin: issue 12 — a bad value from the
// environment or a flag is reported under its key path together with the
// variable or flag it came from; one from the file is not.
func TestLoad_ProblemNamesItsOrigin(t *testing.T) {
	t.Setenv("SHAPER_DOWNSTREAMS_PAYMENTS_RATE_LIMIT", "0/s")
	flags := pflag.NewFlagSet("run", pflag.ContinueOnError)
	flags.String("log.level", "", "")
	if err := flags.Parse([]string{"--log.level=loud"}); err != nil {
		t.Fatal(err)
	}
	_, _, err := config.Load(writeConfig(t, laneYAML("", "bucket: {capacity: 0}")), flags)
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{
		"downstreams.payments.rate.limit (from SHAPER_DOWNSTREAMS_PAYMENTS_RATE_LIMIT): ",
		"log.level (from --log.level): ",
		"downstreams.payments.bucket.capacity: ",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}
}
