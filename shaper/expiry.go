package shaper

import (
	"fmt"
	"time"
)

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

// Expired reports whether m, departing at now, must be dead-lettered as
// "expired" instead: it is older than maxAge (SPEC §3 Max age; maxAge 0
// means no limit), or now is after its Shaper-Deadline (SPEC §3
// Per-message control, DepartsTooLate). The lane asks at the instant of
// departure, after every wait, and sweeps its bucket while it waits, so that
// a paused or blocked lane dead-letters messages as they pass max_age or
// their deadline.
func Expired(m *Message, now time.Time, maxAge time.Duration) bool {
	return (maxAge > 0 && m.Age(now) > maxAge) || DepartsTooLate(m, now)
}

// ExpiryCause says why Expired(m, now, maxAge) holds, for the dead letter's
// Shaper-Last-Error: the deadline when it passed, else max_age.
func ExpiryCause(m *Message, now time.Time, maxAge time.Duration) error {
	if DepartsTooLate(m, now) {
		return fmt.Errorf("past its %s %s at departure", DeadlineHeader, m.Deadline.UTC().Format(time.RFC3339Nano))
	}
	return fmt.Errorf("older than bucket.max_age %s at departure", maxAge)
}
