package sinks

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/shaper"
)

// NATS publishes each message to a JetStream subject: the sink of SPEC §4
// kind nats, for lanes that feed another stream at a paced rate.
//
// The published message has the job's payload and headers, minus the
// headers whose name starts with "Nats-" (case-insensitive): those are
// JetStream's instructions to the original stream (Nats-Expected-Stream,
// Nats-Rollup, Nats-TTL, …) and would change or break the publish to the
// target. Nats-Msg-Id is then set to Message.Key() (SPEC G8), so the
// target stream drops a redelivered job as a duplicate within its
// duplicate window (StreamConfig.Duplicates, 2 minutes by default); a
// duplicate counts as delivered.
//
// Send waits for the JetStream publish acknowledgement. A publish error is
// retryable (no stream for the subject, no responders, a timeout, a lost
// connection, a JetStream API error), except a payload larger than the
// server's max_payload, which no retry can fix and is permanent. NATS is
// safe for concurrent use.
type NATS struct {
	js      jetstream.JetStream
	subject string
	gate    gate
}

// NewNATS returns a sink publishing to subject through js. The caller owns
// js and its connection: Close leaves them open.
func NewNATS(js jetstream.JetStream, subject string) *NATS {
	return &NATS{js: js, subject: subject}
}

// Send publishes m and waits for the acknowledgement or the end of ctx. It
// returns nil once the target stream stored the message (or reported it a
// duplicate), otherwise a *shaper.SinkError with Status 0.
func (s *NATS) Send(ctx context.Context, m *shaper.Message) error {
	what := fmt.Sprintf("nats publish to %q", s.subject)
	if !s.gate.enter() {
		return retryable(what, ErrClosed)
	}
	defer s.gate.leave()
	if err := ctx.Err(); err != nil {
		return retryable(what, err)
	}
	h := make(nats.Header, len(m.Header)+1)
	for name, values := range m.Header {
		if hasPrefixFold(name, "Nats-") {
			continue
		}
		h[name] = slices.Clone(values)
	}
	h.Set(jetstream.MsgIDHeader, m.Key())
	_, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: s.subject, Header: h, Data: m.Data})
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w (%v)", ctxErr, err)
	}
	return &shaper.SinkError{
		Permanent: errors.Is(err, nats.ErrMaxPayload),
		Err:       fmt.Errorf("%s: %w", what, err),
	}
}

// Close waits for Sends in progress. It does not close js or its
// connection. It always returns nil; later calls return at once.
func (s *NATS) Close() error {
	s.gate.close()
	return nil
}
