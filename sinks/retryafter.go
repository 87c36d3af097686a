package sinks

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxRetryAfterSeconds is the largest delay-seconds value that fits a
// time.Duration (about 292 years).
const maxRetryAfterSeconds = math.MaxInt64 / uint64(time.Second)

// ParseRetryAfter converts the value of an HTTP Retry-After header into the
// delay it asks for, measured from now. RFC 9110 §10.2.3 allows two forms:
//
//   - delay-seconds, a non-negative decimal integer ("120"). Signs,
//     fractions, exponents and values too large for a time.Duration are
//     rejected.
//   - an HTTP-date, in any of the three formats of RFC 9110 §5.6.7 that
//     http.ParseTime accepts (IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT",
//     RFC 850, asctime). A date at or before now gives 0, true: the
//     downstream may be retried at once. A date too far ahead for a
//     time.Duration gives the largest Duration; the lane caps it with
//     task.retry.max_delay (SPEC §4).
//
// Surrounding spaces and tabs (optional whitespace in RFC 9110 terms) are
// ignored. For an empty or malformed value ParseRetryAfter returns 0, false
// and the caller should ignore the header. The result is never negative.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return 0, false
	}
	if allDigits(v) {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n > maxRetryAfterSeconds {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now) // saturates instead of overflowing
	if d < 0 {
		d = 0
	}
	return d, true
}

// allDigits reports whether s is a non-empty run of ASCII digits (RFC 9110
// delay-seconds = 1*DIGIT).
func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
