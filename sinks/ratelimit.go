package sinks

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// epochResetFloor is the X-RateLimit-Reset value from which it is read as
// Unix seconds (the form of several large APIs) rather than seconds from
// now: 10⁹ seconds is 31 years, no reset delay, and 2001 as an instant.
const epochResetFloor = 1e9

// ParseRateLimit reads the rate-limit headers of a response received at now
// (SPEC §3 Adaptive rate): the IETF draft's RateLimit-Limit,
// RateLimit-Remaining and RateLimit-Reset (delta-seconds), its later
// structured forms RateLimit (r=remaining, t=reset, also
// limit=/remaining=/reset= of draft 3) and RateLimit-Policy (q=limit,
// w=window), and the common X-RateLimit-Limit / -Remaining / -Reset, whose
// reset is delta-seconds or, from epochResetFloor on, Unix seconds. The
// first item of a list is used; a w= parameter gives the window of the
// limit. Malformed values are ignored. ok is false when no header was
// usable. Absent counts are -1 and absent durations 0 (shaper.RateLimitInfo).
func ParseRateLimit(h http.Header, now time.Time) (info shaper.RateLimitInfo, ok bool) {
	info = shaper.RateLimitInfo{Limit: -1, Remaining: -1}
	first := func(names ...string) string {
		for _, n := range names {
			if v := h.Get(n); v != "" {
				return v
			}
		}
		return ""
	}
	if v := first("RateLimit-Limit", "X-RateLimit-Limit"); v != "" {
		n, params := leadingCount(v)
		if n >= 0 {
			info.Limit, ok = n, true
		}
		if w, good := paramSeconds(params, "w"); good {
			info.Window = w
		}
	}
	if v := first("RateLimit-Remaining", "X-RateLimit-Remaining"); v != "" {
		if n, _ := leadingCount(v); n >= 0 {
			info.Remaining, ok = n, true
		}
	}
	if v := h.Get("RateLimit-Reset"); v != "" {
		if d, good := seconds(strings.TrimSpace(v)); good {
			info.Reset, ok = d, true
		}
	} else if v := h.Get("X-RateLimit-Reset"); v != "" {
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f >= 0 && f < 9e9 { // a Duration holds 9.2e9 s
			if f >= epochResetFloor {
				info.Reset = max(0, time.Unix(0, 0).Add(time.Duration(f*float64(time.Second))).Sub(now))
			} else {
				info.Reset = time.Duration(f * float64(time.Second))
			}
			ok = true
		}
	}
	// Structured forms: RateLimit: "default";r=50;t=30 (or limit=, remaining=, reset=).
	if v := h.Get("RateLimit"); v != "" {
		for _, p := range splitParams(v) {
			k, val, _ := strings.Cut(p, "=")
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "r", "remaining":
				if n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64); err == nil && n >= 0 {
					info.Remaining, ok = n, true
				}
			case "t", "reset":
				if d, good := seconds(strings.TrimSpace(val)); good {
					info.Reset, ok = d, true
				}
			case "limit":
				if n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64); err == nil && n >= 0 {
					info.Limit, ok = n, true
				}
			}
		}
	}
	if v := h.Get("RateLimit-Policy"); v != "" {
		params := splitParams(v)
		if n, err := paramInt(params, "q"); err == nil {
			info.Limit, ok = n, true
		}
		if w, good := paramSeconds(params, "w"); good {
			info.Window = w
		}
	}
	return info, ok
}

// leadingCount parses the first item of a list such as "100, 100;w=60" into
// its number (-1 when it is not a non-negative integer) and its parameters,
// or those of the first later item with the same number (draft 3 lists the
// quota policies after the limit in force).
func leadingCount(v string) (int64, []string) {
	items := strings.Split(v, ",")
	parts := strings.Split(items[0], ";")
	n, err := strconv.ParseInt(strings.TrimSpace(parts[0]), 10, 64)
	if err != nil || n < 0 {
		return -1, nil
	}
	if len(parts) > 1 {
		return n, parts[1:]
	}
	for _, it := range items[1:] {
		p := strings.Split(it, ";")
		if m, err := strconv.ParseInt(strings.TrimSpace(p[0]), 10, 64); err == nil && m == n && len(p) > 1 {
			return n, p[1:]
		}
	}
	return n, nil
}

// splitParams splits the first item of a structured field into its
// parameters (and its leading token).
func splitParams(v string) []string {
	item, _, _ := strings.Cut(v, ",")
	if strings.Contains(v, "remaining=") || strings.Contains(v, "reset=") {
		item = v // draft 3: limit=100, remaining=50, reset=5
		return strings.FieldsFunc(item, func(r rune) bool { return r == ',' || r == ';' })
	}
	return strings.Split(item, ";")
}

func paramInt(params []string, key string) (int64, error) {
	for _, p := range params {
		k, val, found := strings.Cut(p, "=")
		if found && strings.EqualFold(strings.TrimSpace(k), key) {
			n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err == nil && n < 0 {
				err = strconv.ErrRange
			}
			return n, err
		}
	}
	return 0, strconv.ErrSyntax
}

func paramSeconds(params []string, key string) (time.Duration, bool) {
	n, err := paramInt(params, key)
	if err != nil || n <= 0 || uint64(n) > maxRetryAfterSeconds {
		return 0, false
	}
	return time.Duration(n) * time.Second, true
}

// seconds parses delta-seconds (a non-negative integer).
func seconds(v string) (time.Duration, bool) {
	if !allDigits(v) {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > maxRetryAfterSeconds {
		return 0, false
	}
	return time.Duration(n) * time.Second, true
}
