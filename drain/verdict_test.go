package drain

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// TestDecide: the retry verdict of SPEC §3 as a table (cases C16, C17).
func TestDecide(t *testing.T) {
	src := config.Source{MaxDeliver: 3}
	retry := config.Retry{Backoff: []time.Duration{time.Second, 5 * time.Second}, RetryAfter: true, MaxDelay: time.Minute}
	noRA := retry
	noRA.RetryAfter = false
	unlimited := config.Source{MaxDeliver: -1}
	netErr := errors.New("connection refused")
	s503 := &shaper.SinkError{Status: 503, RetryAfter: 5 * time.Second, Saturated: true}
	for _, tc := range []struct {
		name      string
		err       error
		timedOut  bool
		delivered uint64
		src       config.Source
		retry     config.Retry
		want      verdict
	}{
		{"delivered", nil, false, 1, src, retry, verdict{kind: verdictAck}},
		{"network error, first delivery", netErr, false, 1, src, retry,
			verdict{kind: verdictRetry, reason: shaper.OutcomeError, delay: time.Second}},
		{"timeout, second delivery", context.DeadlineExceeded, true, 2, src, retry,
			verdict{kind: verdictRetry, reason: shaper.OutcomeTimeout, delay: 5 * time.Second}},
		{"backoff: the last value repeats", netErr, false, 2, unlimited, retry,
			verdict{kind: verdictRetry, reason: shaper.OutcomeError, delay: 5 * time.Second}},
		{"backoff beyond the list", netErr, false, 9, unlimited, retry,
			verdict{kind: verdictRetry, reason: shaper.OutcomeError, delay: 5 * time.Second}},
		{"max_deliver reached", netErr, false, 3, src, retry,
			verdict{kind: verdictDeadLetter, reason: shaper.ReasonMaxDeliver}},
		{"max_deliver -1: never", netErr, false, 1000, unlimited, retry,
			verdict{kind: verdictRetry, reason: shaper.OutcomeError, delay: 5 * time.Second}},
		{"400: permanent", &shaper.SinkError{Status: 400, Permanent: true}, false, 1, src, retry,
			verdict{kind: verdictDeadLetter, reason: shaper.ReasonRejectedBySink, status: 400}},
		{"permanent beats max_deliver", fmt.Errorf("wrapped: %w", &shaper.SinkError{Status: 404, Permanent: true}), false, 3, src, retry,
			verdict{kind: verdictDeadLetter, reason: shaper.ReasonRejectedBySink, status: 404}},
		{"invalid message (sink.url's header missing): dead letter invalid, not attempted",
			&shaper.SinkError{Permanent: true, Err: fmt.Errorf("url: %w: no header", shaper.ErrInvalidMessage)}, false, 3, src, retry,
			verdict{kind: verdictDeadLetter, reason: shaper.ReasonInvalid, status: notAttempted}},
		{"503 Retry-After pauses the lane (C16)", s503, false, 1, src, retry,
			verdict{kind: verdictRetry, reason: shaper.RetryRateLimited, delay: 5 * time.Second, pause: true, status: 503}},
		{"429 Retry-After capped at max_delay", &shaper.SinkError{Status: 429, RetryAfter: time.Hour, Saturated: true}, false, 1, src, retry,
			verdict{kind: verdictRetry, reason: shaper.RetryRateLimited, delay: time.Minute, pause: true, status: 429}},
		{"500 Retry-After: the message waits, the lane does not", &shaper.SinkError{Status: 500, RetryAfter: 7 * time.Second}, false, 1, src, retry,
			verdict{kind: verdictRetry, reason: shaper.OutcomeError, delay: 7 * time.Second, status: 500}},
		{"retry_after off: backoff, no pause", s503, false, 1, src, noRA,
			verdict{kind: verdictRetry, reason: shaper.OutcomeError, delay: time.Second, status: 503}},
		{"429 at max_deliver: dead letter (pushback does not pass the limit)", s503, false, 3, src, retry,
			verdict{kind: verdictDeadLetter, reason: shaper.ReasonMaxDeliver, status: 503}},
		{"no backoff configured: 1 s", netErr, false, 1, src, config.Retry{}, verdict{kind: verdictRetry, reason: shaper.OutcomeError, delay: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide(tc.err, tc.timedOut, tc.delivered, tc.src, tc.retry); got != tc.want {
				t.Errorf("decide = %+v, want %+v", got, tc.want)
			}
		})
	}
}
