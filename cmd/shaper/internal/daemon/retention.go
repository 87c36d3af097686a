package daemon

import (
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/sources"
)

// sourceLimits maps source.retention (validated) to the limits of a source
// stream shaper creates. At max_bytes new publishes are refused (discard
// new): a message is never removed before the lane had it.
func sourceLimits(r config.Retention, replicas int) *sources.StreamLimits {
	kinds := map[string]jetstream.RetentionPolicy{
		config.RetentionLimits:    jetstream.LimitsPolicy,
		config.RetentionWorkQueue: jetstream.WorkQueuePolicy,
		config.RetentionInterest:  jetstream.InterestPolicy,
	}
	return &sources.StreamLimits{Retention: kinds[r.Kind], MaxAge: r.MaxAge, MaxBytes: r.MaxBytes,
		Discard: jetstream.DiscardNew, Replicas: replicas}
}

// deadLetterLimits maps dead_letter_stream to the limits of the dead-letter
// streams shaper creates: limits retention, the oldest removed first, with
// the largest source.replicas of the lanes (a dead letter is kept as safely
// as the message it replaces).
func deadLetterLimits(d config.DeadLetterStream, replicas int) *sources.StreamLimits {
	return &sources.StreamLimits{Retention: jetstream.LimitsPolicy, MaxAge: d.MaxAge, MaxBytes: d.MaxBytes,
		Discard: jetstream.DiscardOld, Replicas: replicas}
}

// maxReplicas is the largest source.replicas of the lanes of cfg (≥ 1).
func maxReplicas(cfg *config.Config) int {
	n := 1
	for _, lc := range cfg.Downstreams {
		n = max(n, lc.Source.Replicas)
	}
	return n
}
