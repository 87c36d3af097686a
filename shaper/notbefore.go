package shaper

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Per-message control headers (SPEC §3 Per-message control), set by the
// producer. Both take an instant in RFC 3339 (e.g. 2026-12-01T11:00:00Z,
// fractions allowed) or Unix seconds (e.g. 1796122800, or 1796122800.25).
const (
	// NotBeforeHeader holds a message until that instant. A message not yet
	// due is handed back to the stream with a nak delayed until it is due
	// (at most MaxHold per nak), so it holds no bucket slot and blocks no
	// message behind it.
	NotBeforeHeader = "Shaper-Not-Before"
	// DeadlineHeader dead-letters a message as "expired" if it would depart
	// later than that instant; like bucket.max_age it is checked at the
	// instant of departure and takes no departure slot.
	DeadlineHeader = "Shaper-Deadline"
)

// MaxHold caps the delay of one not-yet-due nak. A message due later is
// held again when it comes back (the lane re-reads its header), so that a
// far-off Shaper-Not-Before is re-examined every few minutes (after a
// purge, a config change or a clock step) instead of disappearing into
// the server's redelivery queue for days.
const MaxHold = 5 * time.Minute

// ParseInstant parses the value of a per-message control header: RFC 3339
// (with or without fractional seconds) or Unix seconds, a decimal number
// with an optional fraction. Surrounding space is ignored. It returns an
// error for anything else, for an empty value, and for Unix seconds that
// are negative or not finite.
func ParseInstant(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, fmt.Errorf("empty value")
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && isUnixSeconds(s) {
		if f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f > 1e11 {
			return time.Time{}, fmt.Errorf("%q is out of range for Unix seconds", s)
		}
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(math.Round(frac*1e9))), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither RFC 3339 nor Unix seconds", s)
}

// isUnixSeconds reports whether s is digits with at most one decimal point
// (ParseFloat also accepts "1e9", "0x1p3", "Inf" and "_" separators, which
// no producer means as seconds).
func isUnixSeconds(s string) bool {
	dot := false
	for i, r := range s {
		switch {
		case r >= '0' && r <= '9':
		case r == '.' && !dot && i > 0:
			dot = true
		default:
			return false
		}
	}
	return true
}

// Timing is a message's per-message control, read from its headers by
// TimingOf. A zero instant means the header is absent.
type Timing struct {
	NotBefore time.Time // Shaper-Not-Before
	Deadline  time.Time // Shaper-Deadline
}

// TimingOf reads Shaper-Not-Before and Shaper-Deadline from h (the header
// names match case-insensitively, as HTTP and NATS headers do). A value that
// ParseInstant rejects is an error naming the header; the lane dead-letters
// such a message with reason "invalid" (SPEC §3). A header given twice with
// different values is an error too: which one the producer meant is unknown.
func TimingOf(h map[string][]string) (Timing, error) {
	return timingFrom(h, nil)
}

// TimingOfMessage is TimingOf of m's headers, packed or not (PackHeader):
// the lane reads them at admission, while they may still be packed.
// It allocates nothing for a message without these headers (the lane calls
// it for every admitted message; issue 15).
func TimingOfMessage(m *Message) (Timing, error) { return timingFrom(nil, m) }

// timingFrom reads the timing headers of m when m is not nil, else of h.
// (Two arguments rather than a lookup function: a method value passed as a
// func would be allocated on every call.)
func timingFrom(h map[string][]string, m *Message) (t Timing, err error) {
	if t.NotBefore, err = instantHeader(h, m, NotBeforeHeader); err != nil {
		return Timing{}, err
	}
	if t.Deadline, err = instantHeader(h, m, DeadlineHeader); err != nil {
		return Timing{}, err
	}
	return t, nil
}

// instantHeader parses header name of m (when not nil) or h as an instant
// (ParseInstant); zero when it is absent.
func instantHeader(h map[string][]string, m *Message, name string) (time.Time, error) {
	var vals []string
	if m != nil {
		vals = m.HeaderValues(name)
	} else {
		vals = headerValues(h, name)
	}
	if len(vals) == 0 {
		return time.Time{}, nil
	}
	for _, v := range vals[1:] {
		if v != vals[0] {
			return time.Time{}, fmt.Errorf("header %s: %d different values", name, len(vals))
		}
	}
	at, err := ParseInstant(vals[0])
	if err != nil {
		return time.Time{}, fmt.Errorf("header %s: %w", name, err)
	}
	return at, nil
}

// headerValues returns the values of header name in h, the exact key
// first, else any key equal to it ignoring case.
func headerValues(h map[string][]string, name string) []string {
	if v, ok := h[name]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return nil
}

// HoldFor returns how long a message with Not-Before notBefore, received at
// now, must still be held: notBefore − now, capped at maxHold (a later
// delivery holds it again); 0 when it is due (no header, or notBefore ≤ now).
// maxHold ≤ 0 means no cap.
func HoldFor(notBefore, now time.Time, maxHold time.Duration) time.Duration {
	if notBefore.IsZero() || !notBefore.After(now) {
		return 0
	}
	d := notBefore.Sub(now)
	if maxHold > 0 && d > maxHold {
		d = maxHold
	}
	return d
}

// Holds returns how many of a message's deliveries at most went to holding
// it (the naks of HoldFor): a message published at published with Not-Before
// notBefore is held ceil((notBefore − published) / maxHold) times if the
// lane saw it at once, fewer if it saw it later; 0 without a Not-Before
// later than its publish time, or when published is unknown. The lane
// subtracts it from the server's delivery count, so that holds do not count
// toward source.max_deliver (see DeliveryAttempt).
func Holds(published, notBefore time.Time, maxHold time.Duration) uint64 {
	if published.IsZero() || notBefore.IsZero() || !notBefore.After(published) {
		return 0
	}
	if maxHold <= 0 {
		return 1
	}
	span := notBefore.Sub(published)
	return uint64((span + maxHold - 1) / maxHold)
}

// DeliveryAttempt returns which delivery attempt this delivery of m is, counting
// only deliveries that could reach the sink: the server's delivery count
// (NumDelivered) less the holds of a Not-Before (Holds with MaxHold), never
// below 1. The retry verdict compares it with source.max_deliver and
// indexes task.retry.backoff with it. Holds is an upper bound (a message
// the lane first saw after some of its hold time had passed was held
// fewer times), so the rule errs toward one more attempt, never one less.
func DeliveryAttempt(m *Message) uint64 {
	n := m.NumDelivered
	h := Holds(m.Published, m.NotBefore, MaxHold)
	if n <= h {
		return 1
	}
	return n - h
}

// DepartsTooLate reports whether m, departing at now, would leave after its
// Shaper-Deadline (SPEC §3 Per-message control); false without one.
func DepartsTooLate(m *Message, now time.Time) bool {
	return !m.Deadline.IsZero() && now.After(m.Deadline)
}
