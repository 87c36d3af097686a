package drain

import (
	"errors"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// verdictKind is the final verb a finished attempt leads to.
type verdictKind int

const (
	verdictAck        verdictKind = iota // the sink accepted it
	verdictRetry                         // nak with delay for redelivery
	verdictDeadLetter                    // dead letter with reason, then term
)

// verdict is what one finished attempt leads to (SPEC §3, Retries). It is
// decided by decide, a pure function, and carried out by Lane.settle.
type verdict struct {
	kind verdictKind
	// reason is the dead-letter reason (verdictDeadLetter) or the retry
	// reason of shaper_retries_total (verdictRetry): error, timeout,
	// rate_limited.
	reason string
	// delay is the nak delay (verdictRetry).
	delay time.Duration
	// pause is true when the whole lane must pause for delay: a 429/503
	// with Retry-After honoured (SPEC §3).
	pause bool
	// status is the downstream's status code, 0 when none.
	status int
}

// decide returns the verdict for an attempt that ended with err (nil =
// delivered; timedOut when the task timeout ended it), of a message the
// server delivered delivered times, under the lane's retry rules:
//   - a message the sink could not build a request from (errors.Is
//     ErrInvalidMessage: a header sink.url references is missing) is
//     dead-lettered invalid, as not attempted: the request never left;
//   - a permanent failure (errors.Is ErrPermanent: a 4xx other than 408/429,
//     or a status not listed as retryable) is dead-lettered rejected_by_sink;
//   - a failure at delivery count ≥ source.max_deliver (> 0) is
//     dead-lettered max_deliver;
//   - otherwise it is retried after task.retry.backoff[delivered−1] (the last
//     value repeats), or after the response's Retry-After when
//     task.retry.retry_after is on (capped at max_delay); a Retry-After on a
//     429/503 (Saturated) also pauses the lane, reason rate_limited.
func decide(err error, timedOut bool, delivered uint64, src config.Source, retry config.Retry) verdict {
	if err == nil {
		return verdict{kind: verdictAck}
	}
	var se *shaper.SinkError
	errors.As(err, &se)
	v := verdict{}
	if se != nil {
		v.status = se.Status
	}
	if errors.Is(err, shaper.ErrInvalidMessage) {
		v.kind, v.reason, v.status = verdictDeadLetter, shaper.ReasonInvalid, notAttempted
		return v
	}
	if errors.Is(err, shaper.ErrPermanent) {
		v.kind, v.reason = verdictDeadLetter, shaper.ReasonRejectedBySink
		return v
	}
	if src.MaxDeliver > 0 && delivered >= uint64(src.MaxDeliver) {
		v.kind, v.reason = verdictDeadLetter, shaper.ReasonMaxDeliver
		return v
	}
	v.kind, v.delay, v.reason = verdictRetry, backoff(retry.Backoff, delivered), shaper.OutcomeError
	if timedOut {
		v.reason = shaper.OutcomeTimeout
	}
	if se != nil && se.RetryAfter > 0 && retry.RetryAfter {
		v.delay = se.RetryAfter
		if retry.MaxDelay > 0 && v.delay > retry.MaxDelay {
			v.delay = retry.MaxDelay
		}
		if se.Saturated {
			v.reason, v.pause = shaper.RetryRateLimited, true
		}
	}
	return v
}

// backoff returns the retry delay for delivery count n (SPEC §3: indexed by
// delivery count, the last value repeats; 1 s when none is configured).
func backoff(b []time.Duration, n uint64) time.Duration {
	if len(b) == 0 {
		return time.Second
	}
	i := int(min(n, uint64(len(b)))) - 1
	if i < 0 {
		i = 0
	}
	return b[i]
}
