package daemon

import (
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/sources"
)

// sourceLimits maps source.retention (validated) to the limits of a source
// stream shaper creates. At max_bytes new publishes are refused (discard
// new): a message is never removed before the lane had it.
func sourceLimits(r config.Retention) *sources.StreamLimits {
	kinds := map[string]jetstream.RetentionPolicy{
		config.RetentionLimits:    jetstream.LimitsPolicy,
		config.RetentionWorkQueue: jetstream.WorkQueuePolicy,
		config.RetentionInterest:  jetstream.InterestPolicy,
	}
	return &sources.StreamLimits{Retention: kinds[r.Kind], MaxAge: r.MaxAge, MaxBytes: r.MaxBytes,
		Discard: jetstream.DiscardNew}
}

// deadLetterLimits maps dead_letter_stream to the limits of the dead-letter
// streams shaper creates: limits retention, the oldest removed first.
func deadLetterLimits(d config.DeadLetterStream) *sources.StreamLimits {
	return &sources.StreamLimits{Retention: jetstream.LimitsPolicy, MaxAge: d.MaxAge, MaxBytes: d.MaxBytes,
		Discard: jetstream.DiscardOld}
}
