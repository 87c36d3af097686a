package sinks_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/sinks"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		// delay-seconds (RFC 9110 §10.2.3)
		{"0", 0, true},
		{"1", time.Second, true},
		{"120", 2 * time.Minute, true},
		{" 30\t", 30 * time.Second, true},
		{"007", 7 * time.Second, true},
		{"9223372036", 9223372036 * time.Second, true}, // largest that fits a Duration
		{"9223372037", 0, false},                       // overflows a Duration
		{"99999999999999999999999", 0, false},          // overflows uint64
		{"-1", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"1e3", 0, false},
		{"0x10", 0, false},
		{"1_000", 0, false},
		{"5 s", 0, false},
		{"", 0, false},
		{"   ", 0, false},
		{"soon", 0, false},
		{"١٢", 0, false}, // Arabic-Indic digits are not DIGIT
		// HTTP-date, the three formats of RFC 9110 §5.6.7
		{"Sat, 01 Mar 2025 12:00:30 GMT", 30 * time.Second, true},         // IMF-fixdate
		{"Saturday, 01-Mar-25 12:01:00 GMT", time.Minute, true},           // RFC 850
		{"Sat Mar  1 13:00:00 2025", time.Hour, true},                     // asctime
		{"Sat, 01 Mar 2025 12:00:00 GMT", 0, true},                        // now
		{"Sat, 01 Mar 2025 11:59:00 GMT", 0, true},                        // past
		{"Thu, 01 Jan 1970 00:00:00 GMT", 0, true},                        // far past
		{"Fri, 31 Dec 9999 23:59:59 GMT", time.Duration(1<<63 - 1), true}, // saturates
		{"Sat, 01 Mar 2025 12:00:30 PST", 0, false},                       // only GMT
		{"2025-03-01T12:00:30Z", 0, false},                                // RFC 3339 is not an HTTP-date
	}
	for _, tt := range tests {
		got, ok := sinks.ParseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, seed := range []string{
		"0", "120", "-1", "1.5", "", " 7 ", "9223372036", "9223372037",
		"99999999999999999999999", now.Add(time.Minute).Format(http.TimeFormat),
		"Saturday, 01-Mar-25 12:01:00 GMT", "Sat Mar  1 13:00:00 2025",
		"Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT",
	} {
		f.Add(seed, now.Unix())
	}
	f.Fuzz(func(t *testing.T, v string, nowUnix int64) {
		d, ok := sinks.ParseRetryAfter(v, time.Unix(nowUnix, 0))
		if d < 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, negative", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false; a rejected value must give 0", v, d)
		}
	})
}
