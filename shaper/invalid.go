package shaper

import "errors"

// ErrInvalidMessage marks a sink failure caused by the message itself, which
// neither a retry nor the downstream can fix: the sink could not build a
// delivery from it (SPEC §3 Per-message address: a header that sink.url
// references is missing, or the subject has too few tokens). The lane
// dead-letters such a message at once with reason "invalid" (ReasonInvalid),
// and the error text, kept as its Shaper-Last-Error, names what is missing.
//
// Sinks return it inside a *SinkError with Permanent set, so errors.Is finds
// both ErrInvalidMessage and ErrPermanent: code that knows only ErrPermanent
// still never retries it. The request never left, so it is neither a success
// nor a failure of the downstream (the breaker counts it neither way).
var ErrInvalidMessage = errors.New("shaper: invalid message")
