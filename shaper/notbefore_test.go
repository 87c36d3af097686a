package shaper_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// TestParseInstant: SPEC §3 Per-message control — RFC 3339 or Unix
// seconds; anything else is an error that says what it got.
func TestParseInstant(t *testing.T) {
	utc := func(s string) time.Time { v, _ := time.Parse(time.RFC3339Nano, s); return v }
	for _, tc := range []struct {
		in      string
		want    time.Time
		wantErr string
	}{
		{in: "2026-12-01T11:00:00Z", want: utc("2026-12-01T11:00:00Z")},
		{in: "2026-12-01T12:00:00.25+01:00", want: utc("2026-12-01T11:00:00.25Z")},
		{in: " 2026-12-01T11:00:00Z\t", want: utc("2026-12-01T11:00:00Z")},
		{in: "1796122800", want: time.Unix(1796122800, 0)},
		{in: "1796122800.5", want: time.Unix(1796122800, 5e8)},
		{in: "0", want: time.Unix(0, 0)},
		{in: "", wantErr: "empty"},
		{in: "tomorrow", wantErr: `"tomorrow" is neither RFC 3339 nor Unix seconds`},
		{in: "2026-12-01 11:00:00", wantErr: "neither"},
		{in: "2026-12-01", wantErr: "neither"},
		{in: "-5", wantErr: "neither"},
		{in: "1e9", wantErr: "neither"},
		{in: "Inf", wantErr: "neither"},
		{in: "0x10", wantErr: "neither"},
		{in: "1_000", wantErr: "neither"},
		{in: ".5", wantErr: "neither"},
		{in: "1.2.3", wantErr: "neither"},
		{in: "99999999999999", wantErr: "out of range"},
	} {
		got, err := shaper.ParseInstant(tc.in)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseInstant(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
		case err != nil || !got.Equal(tc.want):
			t.Errorf("ParseInstant(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestTimingOf: both headers, case-insensitive names, and errors that name
// the header (the dead letter's reason is invalid, naming it).
func TestTimingOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       map[string][]string
		nb, dl  int64 // Unix seconds, 0 = none
		wantErr string
	}{
		{name: "none", h: map[string][]string{"Other": {"x"}}},
		{name: "not before", h: map[string][]string{"Shaper-Not-Before": {"100"}}, nb: 100},
		{name: "deadline", h: map[string][]string{"Shaper-Deadline": {"200"}}, dl: 200},
		{name: "both", h: map[string][]string{"Shaper-Not-Before": {"100"}, "Shaper-Deadline": {"1970-01-01T00:03:20Z"}}, nb: 100, dl: 200},
		{name: "lower case", h: map[string][]string{"shaper-not-before": {"100"}}, nb: 100},
		{name: "repeated same", h: map[string][]string{"Shaper-Deadline": {"200", "200"}}, dl: 200},
		{name: "bad not before", h: map[string][]string{"Shaper-Not-Before": {"soon"}}, wantErr: `header Shaper-Not-Before: "soon" is neither`},
		{name: "bad deadline", h: map[string][]string{"Shaper-Not-Before": {"100"}, "Shaper-Deadline": {"later"}}, wantErr: "header Shaper-Deadline:"},
		{name: "empty", h: map[string][]string{"Shaper-Deadline": {""}}, wantErr: "header Shaper-Deadline: empty"},
		{name: "repeated different", h: map[string][]string{"Shaper-Not-Before": {"100", "101"}}, wantErr: "header Shaper-Not-Before: 2 different values"},
	} {
		got, err := shaper.TimingOf(tc.h)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		at := func(s int64) time.Time {
			if s == 0 {
				return time.Time{}
			}
			return time.Unix(s, 0)
		}
		if !got.NotBefore.Equal(at(tc.nb)) || !got.Deadline.Equal(at(tc.dl)) {
			t.Errorf("%s: %+v, want not before %v, deadline %v", tc.name, got, at(tc.nb), at(tc.dl))
		}
	}
}

// TestHoldFor: how long a not-yet-due message is held per nak, capped.
func TestHoldFor(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		notBefore time.Time
		max, want time.Duration
	}{
		{time.Time{}, time.Minute, 0},                                // no header
		{now.Add(-time.Second), time.Minute, 0},                      // past
		{now, time.Minute, 0},                                        // due exactly now
		{now.Add(time.Nanosecond), time.Minute, time.Nanosecond},     // not yet
		{now.Add(3 * time.Second), time.Minute, 3 * time.Second},     // under the cap
		{now.Add(time.Hour), 5 * time.Minute, 5 * time.Minute},       // capped: held again later
		{now.Add(time.Hour), 0, time.Hour},                           // no cap
		{now.Add(5 * time.Minute), 5 * time.Minute, 5 * time.Minute}, // at the cap
	} {
		if got := shaper.HoldFor(tc.notBefore, now, tc.max); got != tc.want {
			t.Errorf("HoldFor(now%+v, max %v) = %v, want %v", tc.notBefore.Sub(now), tc.max, got, tc.want)
		}
	}
}

// TestDeliveryAttempt: holds of a Not-Before are taken out of the delivery
// count that source.max_deliver and the backoff see: ceil((not before −
// published) / MaxHold) of them, never below attempt 1.
func TestDeliveryAttempt(t *testing.T) {
	pub := time.Unix(1000, 0)
	for _, tc := range []struct {
		name      string
		notBefore time.Duration // after publish; 0 = none
		delivered uint64
		want      uint64
	}{
		{"no header, first", 0, 1, 1},
		{"no header, third", 0, 3, 3},
		{"3 s hold, first attempt", 3 * time.Second, 2, 1},
		{"3 s hold, second attempt", 3 * time.Second, 3, 2},
		{"12 min hold: 3 naks at 5 min", 12 * time.Minute, 4, 1},
		{"12 min hold, third attempt", 12 * time.Minute, 6, 3},
		{"exactly 2 × MaxHold: 2 naks", 2 * shaper.MaxHold, 3, 1},
		{"seen after it was due: one extra attempt, never one less", 3 * time.Second, 1, 1},
		{"not before in the past of the publish", -time.Second, 2, 2},
	} {
		m := &shaper.Message{Published: pub, NumDelivered: tc.delivered}
		if tc.notBefore != 0 {
			m.NotBefore = pub.Add(tc.notBefore)
		}
		if got := shaper.DeliveryAttempt(m); got != tc.want {
			t.Errorf("%s: DeliveryAttempt = %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := shaper.Holds(time.Time{}, pub, shaper.MaxHold); got != 0 {
		t.Errorf("Holds with an unknown publish time = %d, want 0", got)
	}
}

// TestExpiredDeadline: shaper.Expired covers Shaper-Deadline as well as
// bucket.max_age: a message departing after its deadline is expired (at
// the deadline itself it may still leave), with a cause naming the header.
func TestExpiredDeadline(t *testing.T) {
	pub := time.Unix(1000, 0)
	dl := pub.Add(10 * time.Second)
	for _, tc := range []struct {
		name     string
		deadline time.Time
		maxAge   time.Duration
		at       time.Duration // after publish
		want     bool
		cause    string
	}{
		{"no deadline, no max age", time.Time{}, 0, time.Hour, false, ""},
		{"before the deadline", dl, 0, 9 * time.Second, false, ""},
		{"at the deadline", dl, 0, 10 * time.Second, false, ""},
		{"after the deadline", dl, 0, 10*time.Second + time.Nanosecond, true, "past its Shaper-Deadline"},
		{"max age first", dl, 5 * time.Second, 6 * time.Second, true, "older than bucket.max_age 5s"},
		{"deadline within max age", dl, time.Minute, 11 * time.Second, true, "Shaper-Deadline 1970-01-01T00:16:50Z"},
	} {
		m := &shaper.Message{Published: pub, Deadline: tc.deadline}
		now := pub.Add(tc.at)
		got := shaper.Expired(m, now, tc.maxAge)
		if got != tc.want {
			t.Errorf("%s: Expired = %v, want %v", tc.name, got, tc.want)
		}
		if got {
			if c := shaper.ExpiryCause(m, now, tc.maxAge).Error(); !strings.Contains(c, tc.cause) {
				t.Errorf("%s: cause %q, want it to contain %q", tc.name, c, tc.cause)
			}
		}
	}
}
