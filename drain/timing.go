package drain

import (
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// holdNotDue applies a message's per-message control at admission (SPEC §3
// Per-message control): it reads Shaper-Not-Before and Shaper-Deadline into
// m (a malformed value makes m invalid, naming the header: the admission
// dead-letters it with reason "invalid"), and hands a message that is not
// yet due back to the stream with a nak delayed until it is due (at most
// shaper.MaxHold; it is held again if it comes back early), giving back the
// bucket slot the fetch reserved for it: a held message takes no slot and
// does not block the messages behind it. A message whose deadline comes
// before its Not-Before could only depart too late: it is dead-lettered
// "expired" at once. It reports whether it took m (held or expired).
//
// A hold is a delivery by the server: shaper.DeliveryAttempt takes the holds
// out of the delivery count, so that they do not count toward
// source.max_deliver. Held messages still count against the consumer's
// max_ack_pending until they come back (NOTES.md): more messages held at
// once than max_ack_pending − capacity stall the consumer.
func (l *Lane) holdNotDue(m *shaper.Message, reserved bool) bool {
	if m.Invalid != "" {
		return false
	}
	t, err := shaper.TimingOfMessage(m) // the headers may be packed until departure
	if err != nil {
		m.Invalid = err.Error()
		return false
	}
	m.NotBefore, m.Deadline = t.NotBefore, t.Deadline
	if !m.Deadline.IsZero() {
		l.deadlines.Store(true) // the sweeps look for deadlines from now on (depart.go)
	}
	if m.NotBefore.IsZero() {
		return false // no clock read for a message without Shaper-Not-Before
	}
	hold := shaper.HoldFor(m.NotBefore, time.Now(), shaper.MaxHold)
	if hold == 0 {
		return false
	}
	if reserved {
		l.bucket.Release(1)
	}
	if !m.Deadline.IsZero() && m.Deadline.Before(m.NotBefore) {
		l.expire(m, m.NotBefore, 0) // it cannot depart before its deadline
		return true
	}
	if err := m.Acker.Nak(hold); err != nil {
		// The server redelivers it after ack_wait: held longer, not lost.
		l.log.Warn("not-before nak failed", "msg_id", m.Key(), "err", err)
	}
	l.m.Retries[shaper.RetryNotBefore].Inc()
	l.log.Debug("held until its not-before", "msg_id", m.Key(), "not_before", m.NotBefore.Format(time.RFC3339Nano),
		"wait", hold)
	return true
}
