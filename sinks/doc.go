// Package sinks delivers a lane's tasks to its downstream: an HTTP endpoint
// ([HTTP]), a JetStream subject ([NATS]) or a JSON-lines log ([Log]).
//
// Every sink satisfies the worker's Sink interface (Send and Close) with one
// shared contract, checked for each of them by the conformance suite in
// package sinktest:
//
//   - Send is safe for concurrent use (the worker calls it from up to
//     max_in_flight goroutines at once).
//   - Send honours its ctx (the per-task timeout, SPEC §3): a context that is
//     already done makes Send fail before it touches the downstream, and a
//     deadline that passes while the downstream is slow makes Send return at
//     once with an error for which errors.Is(err, context.DeadlineExceeded)
//     holds.
//   - Send returns nil only when the downstream confirmed the delivery.
//     Every other result is a *[shaper.SinkError] (found with errors.As);
//     it is retryable unless its Permanent field is set, in which case
//     errors.Is(err, shaper.ErrPermanent) holds and the worker dead-letters
//     the message with reason "rejected_by_sink". A message the sink cannot
//     build a delivery from (the HTTP sink's per-message address lacks a
//     header) is a permanent SinkError that also wraps
//     [shaper.ErrInvalidMessage]: dead letter "invalid", nothing sent.
//   - Send never modifies the message it is given, and no error text or log
//     record contains a payload.
//   - Close waits for Sends in progress to return (each is bounded by its
//     ctx), releases what the sink owns, and is idempotent. A Send after
//     Close fails with a retryable error wrapping [ErrClosed], so the
//     message is redelivered rather than dead-lettered. Close never closes
//     what the caller passed in (an io.Writer, a JetStream context, an
//     *http.Client).
package sinks
