package sources

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamLimits are the retention and limits of a stream shaper creates
// (source.retention, dead_letter_stream; NOTES.md: a stream created with no
// limits keeps every message forever).
type StreamLimits struct {
	// Retention is JetStream's retention policy: jetstream.LimitsPolicy
	// (keep until a limit removes it), WorkQueuePolicy (remove once
	// acknowledged; no overlapping consumers) or InterestPolicy (remove
	// once every consumer acknowledged it).
	Retention jetstream.RetentionPolicy
	// MaxAge removes messages older than this; 0 = no limit.
	MaxAge time.Duration
	// MaxBytes caps the stream's size in bytes; 0 = no limit.
	MaxBytes int64
	// Discard says what happens at MaxBytes: jetstream.DiscardNew refuses
	// new publishes (a source stream: nothing is removed before the lane
	// had it), DiscardOld removes the oldest (dead letters).
	Discard jetstream.DiscardPolicy
	// Replicas is the stream's replicas (R) on a cluster (source.replicas);
	// 0 = the server's default (1).
	Replicas int
}

// apply sets l on a stream to be created; nil leaves sc as it is.
func (l *StreamLimits) apply(sc *jetstream.StreamConfig) {
	if l == nil {
		return
	}
	sc.Retention = l.Retention
	sc.MaxAge = l.MaxAge
	sc.MaxBytes = maxBytes(l.MaxBytes)
	sc.Discard = l.Discard
	sc.Replicas = l.Replicas
}

// maxBytes is the server's spelling of a byte limit: -1 for none.
func maxBytes(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// warnIfDiffers logs a warning when the existing stream's retention, max age
// or max bytes are not those of l; nothing is changed. nil l or log: no
// check.
func (l *StreamLimits) warnIfDiffers(log *slog.Logger, name string, have jetstream.StreamConfig) {
	if l == nil || log == nil {
		return
	}
	if want := max(l.Replicas, 1); max(have.Replicas, 1) != want {
		// Changing the replicas of a stream in use moves its data between
		// servers; that is the operator's decision, never shaper's.
		log.Warn("stream replicas differ from source.replicas; the existing stream keeps its replicas",
			"stream", name, "replicas", max(have.Replicas, 1), "want_replicas", want)
	}
	if have.Retention == l.Retention && have.MaxAge == l.MaxAge && maxBytes(have.MaxBytes) == maxBytes(l.MaxBytes) {
		return
	}
	log.Warn("stream retention differs from the configuration; the existing stream is left as it is (shaper applies retention only to streams it creates)",
		"stream", name,
		"retention", have.Retention.String(), "want_retention", l.Retention.String(),
		"max_age", have.MaxAge.String(), "want_max_age", l.MaxAge.String(),
		"max_bytes", maxBytes(have.MaxBytes), "want_max_bytes", maxBytes(l.MaxBytes))
}
