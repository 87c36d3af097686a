package drain

import (
	"context"
	"strconv"

	"github.com/shaper-dev/shaper/shaper"
)

// Dead-letter header names (SPEC §3, Dead letter).
const (
	HeaderReason     = "Shaper-Reason"
	HeaderDownstream = "Shaper-Downstream"
	HeaderAttempts   = "Shaper-Attempts"
	HeaderLastError  = "Shaper-Last-Error"
	HeaderLastStatus = "Shaper-Last-Status"
	HeaderStream     = "Shaper-Stream"
	HeaderStreamSeq  = "Shaper-Stream-Seq"
	// HeaderKey carries the message's idempotency key (SPEC G8) on a dead
	// letter, whose own Nats-Msg-Id is "<lane>/<key>": the dead-letter
	// stream de-duplicates by Nats-Msg-Id, and two lanes may dead-letter
	// messages with the same key.
	HeaderKey = shaper.KeyHeader
	// HeaderSubject carries the original subject, so that a replay does not
	// depend on the source stream still holding the message.
	HeaderSubject = shaper.SubjectHeader
)

// notAttempted is the status passed to deadLetter for a message dead-lettered
// before this delivery reached the sink (overflow, max_wait, expired,
// invalid): its Shaper-Attempts counts only the earlier deliveries' attempts
// and it has no Shaper-Last-Status.
const notAttempted = -1

// deadLetterID is the Nats-Msg-Id of m's dead letter:
// "<lane>/<key>@<publish time, Unix ns>", and for a replayed message
// "…/replay-<dead-letter seq>" after it (no "@…" when the source gives no
// publish time). The dead-letter stream's duplicate window remembers an id
// for minutes, and a second dead letter under the same id is acknowledged
// as a duplicate and stored nowhere, while the original is terminated: lost
// (G4). The same message dead-lettered again (a redelivery after a term
// that failed) keeps its id, and is rightly stored once. But a replay
// deletes the first dead letter and may fail again (hence the replay
// suffix), and a key is not unique across a stream that was recreated:
// "<stream>:<seq>" starts again at 1 (a new-user pass lost a rejected job
// that way, under a second job's identical key; hence the publish time).
func deadLetterID(lane string, m *shaper.Message) string {
	id := lane + "/" + m.Key()
	if !m.Published.IsZero() {
		id += "@" + strconv.FormatInt(m.Published.UnixNano(), 10)
	}
	if v, ok := m.HeaderValue(shaper.ReplayOfHeader); ok {
		id += "/replay-" + v
	}
	return id
}

// deadLetter publishes m with its reason to the dead-letter subject and, once
// the server acknowledged that publish, terminates the original (SPEC §3,
// G4). When the publish fails the original is nak'd instead: nothing is lost.
// It reports whether the message was dead-lettered.
func (l *Lane) deadLetter(m *shaper.Message, reason string, cause error, status int) bool {
	if l.dead == nil {
		l.log.Error("no dead-letter publisher; message handed back", "msg_id", m.Key(), "reason", reason)
		l.nak(m, backoff(l.conf().Task.Retry.Backoff, m.NumDelivered), shaper.OutcomeError)
		return false
	}
	orig := m.HeaderMap() // packed until departure (shaper.Message.PackHeader)
	h := make(map[string][]string, len(orig)+7)
	for k, v := range orig {
		h[k] = v
	}
	h[HeaderReason] = []string{reason}
	h[HeaderDownstream] = []string{l.name}
	attempts := shaper.DeliveryAttempt(m) // not counting Not-Before holds
	if m.NumDelivered == 0 {
		attempts = 0 // not from a server delivery
	}
	if status == notAttempted && attempts > 0 {
		attempts-- // this delivery never reached the sink
	}
	h[HeaderAttempts] = []string{strconv.FormatUint(attempts, 10)}
	if cause != nil {
		h[HeaderLastError] = []string{truncate(cause.Error(), 512)}
	}
	if status != notAttempted {
		h[HeaderLastStatus] = []string{strconv.Itoa(status)}
	}
	h[HeaderStream] = []string{m.Stream}
	h[HeaderStreamSeq] = []string{strconv.FormatUint(m.StreamSeq, 10)}
	h[HeaderKey] = []string{m.Key()}
	// A replayed message's Shaper-Replay-Of is in the dead letter's id: kept
	// as a header, it would make the dead letter's Key the original key.
	delete(h, shaper.ReplayOfHeader)
	h[HeaderSubject] = []string{m.Subject}
	// The publisher's Nats-Msg-Id, for the HTTP sink's X-Nats-Msg-Id on a
	// replay. A replay carries it already (or none: the job had none), and
	// its own Nats-Msg-Id is the replay's; on any other job the header is
	// the publisher's id, whatever the job carried under that name.
	if _, replay := orig[shaper.ReplayOfHeader]; !replay { // the map in hand, not a second scan
		delete(h, shaper.OrigMsgIDHeader)
		if id, ok := orig[shaper.MsgIDHeader]; ok {
			h[shaper.OrigMsgIDHeader] = id
		}
	}
	h[shaper.MsgIDHeader] = []string{deadLetterID(l.name, m)} // the NATS sink publishes under dm.Key()
	dm := *m
	dm.Header = h
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	err := l.dead.Send(ctx, &dm)
	cancel()
	if err != nil {
		l.log.Error("dead-letter publish failed; message handed back", "msg_id", m.Key(), "reason", reason, "err", err)
		l.nak(m, backoff(l.conf().Task.Retry.Backoff, m.NumDelivered), shaper.OutcomeError)
		return false
	}
	if err := m.Acker.Term(reason); err != nil {
		l.log.Warn("term failed after dead letter", "msg_id", m.Key(), "err", err)
	}
	l.deadLettered.Add(1)
	l.m.DeadLetters[reason].Inc()
	l.logDeadLetter(m.Key(), reason, m.NumDelivered)
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
