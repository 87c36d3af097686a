package config

import (
	"slices"
	"time"
)

// Retention kinds of source.retention.kind: JetStream's retention policies
// of a stream shaper creates.
const (
	// RetentionLimits keeps messages until a limit (age, bytes) removes
	// them, whether acknowledged or not. The default: a stream may be shared
	// with other consumers, and max_age keeps the stream from growing forever.
	RetentionLimits = "limits"
	// RetentionWorkQueue removes a message once it is acknowledged. The
	// server refuses a second consumer whose filter overlaps (two lanes on
	// one stream must not overlap, and nothing else may consume it).
	RetentionWorkQueue = "work_queue"
	// RetentionInterest removes a message once every consumer of the stream
	// acknowledged it; a message published while no consumer exists is not
	// kept.
	RetentionInterest = "interest"
)

// Defaults of the retention of the streams shaper creates (issue 12:
// streams created with no limits kept every message forever, NOTES.md).
// Limits by age never remove a message sooner than its age says, so a
// backlog younger than max_age is safe whatever the lane does.
const (
	DefaultRetentionKind          = RetentionLimits     // source.retention.kind
	DefaultRetentionMaxAge        = 7 * 24 * time.Hour  // source.retention.max_age
	DefaultDeadLetterStreamMaxAge = 30 * 24 * time.Hour // dead_letter_stream.max_age
)

// Retention is source.retention: the limits of a lane's stream when shaper
// creates it (sources.EnsureStream). An existing stream is never changed:
// when its settings differ, the daemon logs a warning saying so.
type Retention struct {
	// Kind is RetentionLimits (default), RetentionWorkQueue or
	// RetentionInterest.
	Kind string `mapstructure:"kind"`
	// MaxAge removes messages older than this (from their publish time),
	// delivered or not. ≥ 0; 0 = no limit; default 168h (7 days). Validate
	// warns when it is shorter than the worst-case wait of a message.
	MaxAge time.Duration `mapstructure:"max_age"`
	// MaxBytes caps the stream's size in bytes. ≥ 0; 0 (default) = no
	// limit. When it is reached new publishes are refused (discard new), so
	// that no message is removed before the lane had it.
	MaxBytes int64 `mapstructure:"max_bytes"`
}

// DeadLetterStream is dead_letter_stream: the limits of the dead-letter
// streams shaper creates (SHAPER_DEAD for shaper.dead.>, and the stream of a
// dead_letter.subject outside it). The oldest dead letters are removed when
// a limit is reached (discard old).
type DeadLetterStream struct {
	// MaxAge removes dead letters older than this. ≥ 0; 0 = keep forever;
	// default 720h (30 days).
	MaxAge time.Duration `mapstructure:"max_age"`
	// MaxBytes caps the stream's size in bytes. ≥ 0; 0 (default) = no limit.
	MaxBytes int64 `mapstructure:"max_bytes"`
}

// retention checks source.retention of the lane whose keys k builds.
func (v *validator) retention(k func(string) string, l Lane) {
	r := l.Source.Retention
	kinds := []string{RetentionLimits, RetentionWorkQueue, RetentionInterest}
	v.check(slices.Contains(kinds, r.Kind), k("source.retention.kind"),
		"must be limits, work_queue or interest, got %q", r.Kind)
	v.check(r.MaxAge >= 0, k("source.retention.max_age"), "must be ≥ 0 (0 = no limit), got %s", r.MaxAge)
	v.check(r.MaxBytes >= 0, k("source.retention.max_bytes"), "must be ≥ 0 (0 = no limit), got %d", r.MaxBytes)
	if r.MaxAge > 0 && l.Bucket.MaxAge > r.MaxAge && !v.p.skip(k("source.retention.max_age"), k("bucket.max_age")) {
		v.warn(k("source.retention.max_age"), "%s is shorter than bucket.max_age %s: the stream removes messages before they could expire as dead letters",
			r.MaxAge, l.Bucket.MaxAge)
	}
}

// deadLetterStream checks dead_letter_stream.
func (v *validator) deadLetterStream() {
	d := v.c.DeadLetterStream
	v.check(d.MaxAge >= 0, "dead_letter_stream.max_age", "must be ≥ 0 (0 = keep forever), got %s", d.MaxAge)
	v.check(d.MaxBytes >= 0, "dead_letter_stream.max_bytes", "must be ≥ 0 (0 = no limit), got %d", d.MaxBytes)
}
