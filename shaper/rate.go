package shaper

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Limit is a rate in messages per second. It is always positive and finite once
// parsed by ParseLimit.
type Limit float64

// Interval returns the emission interval 1/l, the spacing between departures
// at this rate, rounded up to the nanosecond: k intervals never add up to
// less than k/l seconds, so a schedule that steps by Interval never runs
// ahead of the rate however long a window is (at 3,000/s a truncated
// interval gained 1 µs a second, which the whole-interval lag of exact wire
// reports leaves no room for: Pacer.Wire, the tiles).
func (l Limit) Interval() time.Duration {
	return time.Duration(math.Ceil(float64(time.Second) / float64(l)))
}

// String formats l as "N/s".
func (l Limit) String() string {
	// Exact, and never in exponent form (2e+06/s puzzled a new user).
	return strconv.FormatFloat(float64(l), 'f', -1, 64) + "/s"
}

// FormatRate writes a rate in messages per second for a person: four
// significant digits at most and at least to the unit, trailing zeros
// dropped, never in exponent form ("2000000", "3.352", "0.5",
// "0.00001157"), so that a rate in force during warmup does not show as
// 3.3519162934999995 (shaper lanes; found by a new-user pass).
func FormatRate(perSecond float64) string {
	x := math.Abs(perSecond)
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return strconv.FormatFloat(perSecond, 'f', -1, 64)
	}
	prec := max(0, 3-int(math.Floor(math.Log10(x))))
	s := strconv.FormatFloat(perSecond, 'f', prec, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// ErrBadLimit is returned (wrapped) by ParseLimit.
var ErrBadLimit = errors.New("shaper: bad rate")

// ParseLimit parses a rate as SPEC §4 defines it: "N/s", "N/m", "N/h" or a plain
// number of messages per second. N may have a fraction ("0.5/s"). The result
// must be positive and finite; zero, negative, NaN, infinite and unknown units
// ("10/fortnight") return an error wrapping ErrBadLimit.
func ParseLimit(s string) (Limit, error) {
	t := strings.TrimSpace(s)
	num, unit, hasUnit := strings.Cut(t, "/")
	per := 1.0
	if hasUnit {
		switch strings.TrimSpace(unit) {
		case "s":
			per = 1
		case "m":
			per = 60
		case "h":
			per = 3600
		default:
			return 0, fmt.Errorf("%w %q: unit must be /s, /m or /h", ErrBadLimit, s)
		}
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%w %q: must be positive and finite", ErrBadLimit, s)
	}
	if err != nil {
		return 0, fmt.Errorf("%w %q: want N/s, N/m, N/h or a number per second", ErrBadLimit, s)
	}
	v := n / per
	if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, fmt.Errorf("%w %q: must be positive and finite", ErrBadLimit, s)
	}
	return Limit(v), nil
}
