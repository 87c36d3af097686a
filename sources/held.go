package sources

import "sync"

// heldSeqs are the stream sequences of the messages a source handed to its
// lane that have had no final verb (ack, nak, term) yet: what the lane
// holds, in its bucket or in a task.
//
// A message whose ack wait passed while the lane held it is redelivered by
// the server, and a second copy of it would reach the downstream right
// after the first. That happens when no in-progress ack reached the server
// for longer than ack_wait: a NATS outage longer than it (a new-user pass:
// 28 messages of a bucket of 50 went out twice, back to back, after a
// 15-second outage with ack_wait 10s). Fetch does not hand such a
// redelivery to the lane: the copy the lane holds settles the message,
// because the server takes an explicit ack, nak or term by stream sequence
// whatever delivery it names (nats-server consumer.go processAckMsg), and
// an in-progress ack of it keeps the message from being redelivered again.
// Nothing is lost: if the held copy is nak'd or ends otherwise without an
// ack, the server delivers the message again. JetStreamConfig.RedeliverHeld
// turns this off.
type heldSeqs struct {
	mu   sync.Mutex
	seqs map[uint64]struct{}
}

// add records seq as held; false when it already was.
func (h *heldSeqs) add(seq uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seqs == nil {
		h.seqs = map[uint64]struct{}{}
	}
	n := len(h.seqs)
	h.seqs[seq] = struct{}{} // one map operation per message, not a lookup and an insert
	return len(h.seqs) > n
}

// settled forgets seq: its final verb was sent. A nil h does nothing.
func (h *heldSeqs) settled(seq uint64) {
	if h == nil {
		return
	}
	h.mu.Lock()
	delete(h.seqs, seq)
	h.mu.Unlock()
}

// len is how many messages are held (tests).
func (h *heldSeqs) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.seqs)
}
