package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBenchFlagsBadUsage: a section, rate, message count or row filter
// that cannot apply is a usage error (exit 2) with a message, before any
// measurement runs.
func TestBenchFlagsBadUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-section", "bogus"}, `unknown section "bogus"`},
		{[]string{"-rate", "1000"}, "-rate needs -section e2e"},
		{[]string{"-section", "throughput", "-rate", "1000"}, "-rate needs -section e2e"},
		{[]string{"-section", "e2e", "-rate", "-5"}, "-rate needs -section e2e and a positive rate"},
		{[]string{"-section", "e2e", "-msgs", "100"}, "-msgs needs -rate"},
		{[]string{"-section", "cpu", "-only", "shaper"}, "-only needs -section e2e or throughput"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", tc.args, code)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: stderr %q, want it to say %q", tc.args, stderr.String(), tc.want)
		}
	}
}
