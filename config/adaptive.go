package config

import (
	"errors"
	"math"
	"strings"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// OptionalLimit is a rate in messages per second that may be absent: "" (or
// 0) decodes to 0, meaning off; anything else is parsed as a Limit (N/s,
// N/m, N/h or a number per second).
type OptionalLimit shaper.Limit

// On reports whether the rate is set.
func (o OptionalLimit) On() bool { return o > 0 }

func toOptionalLimit(data any) (any, error) {
	switch d := data.(type) {
	case OptionalLimit:
		return d, nil
	case string:
		if strings.TrimSpace(d) == "" {
			return OptionalLimit(0), nil
		}
	case nil:
		return OptionalLimit(0), nil
	}
	l, err := toLimit(data)
	if err != nil {
		return nil, errors.New(err.Error() + ` or "" (off)`)
	}
	return OptionalLimit(l.(shaper.Limit)), nil
}

// Adaptive configures a lane's adaptive rate (SPEC §3 Adaptive rate,
// shaper.Adaptive): AIMD between Min and rate.limit.
type Adaptive struct {
	// Min is the lowest rate, in messages per second; "" (default) = off.
	// > 0 and ≤ rate.limit when set.
	Min OptionalLimit `mapstructure:"min"`
	// Cooldown is the least time between two decreases of the rate. > 0,
	// default 5s.
	Cooldown time.Duration `mapstructure:"cooldown"`
	// Headers follows the downstream's RateLimit-* and X-RateLimit-*
	// response headers. Default true.
	Headers bool `mapstructure:"headers"`
}

// Defaults of rate.adaptive (min "" is off).
const (
	DefaultAdaptiveCooldown = shaper.DefaultAdaptiveCooldown // rate.adaptive.cooldown
	DefaultAdaptiveHeaders  = true                           // rate.adaptive.headers
)

// adaptive checks rate.adaptive; k makes a lane key path.
func (v *validator) adaptive(k func(string) string, r Rate) {
	a := r.Adaptive
	if !a.Min.On() {
		return
	}
	limit := float64(r.Limit)
	if min := float64(a.Min); limit > 0 && !math.IsInf(limit, 0) {
		v.check(min <= limit, k("rate.adaptive.min"), "must be ≤ rate.limit (%s), got %s", formatRate(limit), formatRate(min))
	}
	v.check(a.Cooldown > 0, k("rate.adaptive.cooldown"), "must be > 0, got %s", a.Cooldown)
	v.check(!r.Global, k("rate.adaptive.min"), "the adaptive rate is not supported with rate.global: true yet (the shared schedule runs at rate.limit); set min \"\" or global false")
}

// Quota configures a lane's quota (SPEC §3 Quota, shaper.Quota): at most
// Count departures in any sliding window of Per. With rate.global the
// replicas share it through Redis (redisslots), like the rate.
type Quota struct {
	// Count is the most departures in any window of Per, in messages; 0
	// (default) = no quota. At most MaxQuotaCount.
	Count int `mapstructure:"count"`
	// Per is the length of the sliding window. > 0 when Count is set,
	// default 24h.
	Per time.Duration `mapstructure:"per"`
}

// DefaultQuotaPer is the default of rate.quota.per.
const DefaultQuotaPer = 24 * time.Hour

// MaxQuotaCount is the largest rate.quota.count: the lane keeps one
// departure instant (8 bytes) per departure of the window, 80 MB at most;
// with rate.global, Redis keeps one grant instant (about 10 bytes) per slot
// of the window in the lane's quota list (docs/scaling.md).
const MaxQuotaCount = 10_000_000

// quota checks rate.quota; k makes a lane key path.
func (v *validator) quota(k func(string) string, r Rate) {
	q := r.Quota
	v.check(q.Count >= 0 && q.Count <= MaxQuotaCount, k("rate.quota.count"), "must be in [0, %d] (0 = no quota), got %d", MaxQuotaCount, q.Count)
	if q.Count <= 0 {
		return
	}
	v.check(q.Per > 0, k("rate.quota.per"), "must be > 0, got %s", q.Per)
	if limit := float64(r.Limit); q.Per > 0 && limit > 0 && !math.IsInf(limit, 0) && float64(q.Count) >= limit*q.Per.Seconds() {
		v.warn(k("rate.quota.count"), "%d in %s is no less than rate.limit (%s) allows in that time: the quota never binds", q.Count, q.Per, formatRate(limit))
	}
}
