package shaper

// Dead-letter reasons (SPEC §3; the Shaper-Reason header and the reason label
// of shaper_dead_letters_total).
const (
	// ReasonOverflow: the bucket was full (overflow reject).
	ReasonOverflow = "overflow"
	// ReasonMaxWait: the projected wait exceeded bucket.max_wait.
	ReasonMaxWait = "max_wait"
	// ReasonExpired: older than bucket.max_age at its departure.
	ReasonExpired = "expired"
	// ReasonMaxDeliver: failed at the delivery count source.max_deliver.
	ReasonMaxDeliver = "max_deliver"
	// ReasonRejectedBySink: a failure no retry can fix (ErrPermanent).
	ReasonRejectedBySink = "rejected_by_sink"
	// ReasonInvalid: the source could not make a deliverable message of it.
	ReasonInvalid = "invalid"
	// ReasonPurged: an operator purged the lane (SPEC §3 Operator control).
	ReasonPurged = "purged"
)

// DeadLetterReasons lists every dead-letter reason, in the order metrics
// and docs show them.
var DeadLetterReasons = []string{ReasonOverflow, ReasonMaxWait, ReasonExpired, ReasonMaxDeliver, ReasonRejectedBySink, ReasonInvalid, ReasonPurged}

// Outcomes of a task (one sink call; shaper_task_duration_seconds) and of a
// finished delivery (shaper_deliveries_total), and the reasons a message is
// handed back for redelivery (shaper_retries_total).
const (
	// OutcomeSuccess: the sink accepted it (task), and it was acked (delivery).
	OutcomeSuccess = "success"
	// OutcomeError: the sink call failed (task), or a retry for it.
	OutcomeError = "error"
	// OutcomeTimeout: the call ran out of task.timeout (task), or a retry for it.
	OutcomeTimeout = "timeout"
	// OutcomeRetry: the delivery was nak'd for redelivery.
	OutcomeRetry = "retry"
	// OutcomeDeadLetter: the delivery ended in the dead letter.
	OutcomeDeadLetter = "dead_letter"
	// OutcomeDuplicateSkipped: the key was already delivered within
	// sink.dedup_window (SPEC §3 Delivered-key dedup): acked without a sink
	// call.
	OutcomeDuplicateSkipped = "duplicate_skipped"
	// RetryRateLimited: handed back because the downstream pushed back
	// (429/503 with Retry-After, case C17), not because the message failed.
	RetryRateLimited = "rate_limited"
	// RetryDrain: a drain's leftover, handed back at shutdown.
	RetryDrain = "drain"
	// RetryNotBefore: handed back until its Shaper-Not-Before (a hold,
	// not a failure: it does not count toward source.max_deliver).
	RetryNotBefore = "not_before"
)

// TaskOutcomes, DeliveryOutcomes and RetryReasons list the label values of
// the metrics that count them.
var (
	TaskOutcomes     = []string{OutcomeSuccess, OutcomeError, OutcomeTimeout}
	DeliveryOutcomes = []string{OutcomeSuccess, OutcomeRetry, OutcomeDeadLetter, OutcomeDuplicateSkipped}
	RetryReasons     = []string{OutcomeError, OutcomeTimeout, RetryRateLimited, RetryDrain, RetryNotBefore}
)
