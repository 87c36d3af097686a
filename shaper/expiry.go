package shaper

import "time"

// Age returns how old m is at now for bucket.max_age (SPEC §3 Max age):
// counted from its stream publish time, or from its admission into the
// bucket when the source gave no publish time. Never negative.
func (m *Message) Age(now time.Time) time.Duration {
	born := m.Published
	if born.IsZero() {
		born = m.Admitted
	}
	if born.IsZero() {
		return 0
	}
	return max(0, now.Sub(born))
}

// Expired reports whether m is older than maxAge at now (SPEC §3 Max age);
// maxAge 0 means no limit. The lane asks at the instant of departure, after
// every wait, and sweeps its bucket while it waits, so that a paused or
// blocked lane dead-letters messages as they pass max_age.
func Expired(m *Message, now time.Time, maxAge time.Duration) bool {
	return maxAge > 0 && m.Age(now) > maxAge
}
