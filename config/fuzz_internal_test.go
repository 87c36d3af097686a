package config

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzDuration: the duration decoder never panics, never turns a bare
// number into a non-zero duration (SPEC §4: "5" is an error, not 5 ns), and
// agrees with time.ParseDuration on everything else it accepts.
func FuzzDuration(f *testing.F) {
	for _, s := range []string{"5s", "5", "0", "250ms", "1m30s", "-1s", "1e3", "", " 5s ", "5 s", "0.5h", "9999999999h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := toDuration(s)
		if err != nil {
			return
		}
		d := v.(time.Duration)
		trimmed := strings.TrimSpace(s)
		if _, ferr := strconv.ParseFloat(trimmed, 64); ferr == nil && d != 0 {
			t.Fatalf("bare number %q decoded as %v", s, d)
		}
		if trimmed != "0" {
			if want, perr := time.ParseDuration(trimmed); perr != nil || want != d {
				t.Fatalf("%q decoded as %v; time.ParseDuration says %v, %v", s, d, want, perr)
			}
		}
	})
}
