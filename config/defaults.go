package config

import (
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// DefaultPath is the configuration file Load reads when its path is "".
const DefaultPath = "./config.yaml"

// EnvPrefix starts the name of every environment variable that overrides a
// key: SHAPER_<KEY PATH>, the path upper-cased with "." and "-" replaced by
// "_" (downstreams.eu-west.rate.limit is SHAPER_DOWNSTREAMS_EU_WEST_RATE_LIMIT).
const EnvPrefix = "SHAPER"

// Defaults of SPEC §4 for the keys outside the lanes.
const (
	DefaultEmbeddedListen   = "127.0.0.1:4222" // nats.embedded.listen
	DefaultEmbeddedStoreDir = "./data/nats"    // nats.embedded.store_dir
	DefaultAdminListen      = "127.0.0.1:9464" // admin.listen
	DefaultLogLevel         = "info"           // log.level
	DefaultLogFormat        = "text"           // log.format
	DefaultDrainTimeout     = 30 * time.Second // shutdown.drain_timeout
	DefaultReplicasHint     = 1                // redis.replicas_hint
)

// Defaults of the redis keys that SPEC §4 leaves to us (docs/scaling.md).
const (
	DefaultRedisKeyPrefix = "shaper"              // redis.key_prefix
	DefaultRedisTimeout   = 50 * time.Millisecond // redis.timeout
)

// MinAckWait is the shortest source.ack_wait a config may set. A lane keeps
// the messages it holds (in the bucket, in a task) with in-progress acks
// sent every ack_wait / 4, at least 50 ms apart (drain's house loop), and
// each must reach the server before ack_wait runs out (SPEC G7). Below about
// 200 ms they cannot, and above it a round trip to a loaded server or a
// stalled VM eats the margin: a new-user pass set 1ms and the downstream got
// two messages twice, after hundreds of redeliveries (TestLoad_AckWaitMinimum).
const MinAckWait = time.Second

// Defaults of SPEC §4 for every lane. rate.limit, source.stream,
// source.subjects and sink.kind have none: they are required. Keys not
// listed default to zero (max_ack_pending, max_wait, max_age, slack,
// warmup.period, global).
const (
	DefaultAckWait     = 60 * time.Second         // source.ack_wait
	DefaultMaxDeliver  = 5                        // source.max_deliver
	DefaultReplicas    = 1                        // source.replicas
	DefaultCapacity    = 1000                     // bucket.capacity, messages
	DefaultOverflow    = OverflowBlock            // bucket.overflow
	DefaultColdFactor  = 3.0                      // rate.warmup.cold_factor
	DefaultMinSpacing  = shaper.DefaultMinSpacing // rate.min_spacing
	DefaultTaskTimeout = 5 * time.Second          // task.timeout
	DefaultMaxInFlight = 8                        // task.max_in_flight
	DefaultRetryAfter  = true                     // task.retry.retry_after
	DefaultMaxDelay    = 5 * time.Minute          // task.retry.max_delay
	DefaultSinkMethod  = "POST"                   // sink.method
	// DefaultConsumerPrefix + lane is the consumer of source.consumer "".
	DefaultConsumerPrefix = "shaper-"
	// DefaultDeadLetterPrefix + lane is the subject of dead_letter.subject "".
	DefaultDeadLetterPrefix = "shaper.dead."
)

// Defaults of task.breaker (SPEC §4; failure_ratio 0, the default, is off).
const (
	DefaultBreakerMinAttempts = 20               // task.breaker.min_attempts, attempts
	DefaultBreakerWindow      = 30 * time.Second // task.breaker.window
	DefaultBreakerProbeEvery  = 10 * time.Second // task.breaker.probe_every
)

// DefaultBackoff returns the default task.retry.backoff: 1s, 5s, 30s (a new
// slice on every call).
func DefaultBackoff() []time.Duration {
	return []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
}

// DefaultSuccessStatus returns the default sink.success_status: ["2xx"].
func DefaultSuccessStatus() []string { return []string{"2xx"} }

// laneDefaults is the table of per-lane defaults, by key path relative to
// the lane. Load registers them for every lane found in the file, so viper's
// own precedence decides between an absent key (default) and an explicit one
// (even an invalid zero such as capacity: 0, which Validate then rejects).
func laneDefaults() map[string]any {
	return map[string]any{
		"source.ack_wait":            DefaultAckWait,
		"source.max_deliver":         DefaultMaxDeliver,
		"source.max_ack_pending":     0,
		"source.max_message_bytes":   0,
		"source.standby":             false,
		"source.replicas":            DefaultReplicas,
		"source.retention.kind":      DefaultRetentionKind,
		"source.retention.max_age":   DefaultRetentionMaxAge,
		"source.retention.max_bytes": int64(0),
		"bucket.capacity":            DefaultCapacity,
		"bucket.overflow":            DefaultOverflow,
		"bucket.max_wait":            time.Duration(0),
		"bucket.max_age":             time.Duration(0),
		"bucket.fair_key":            "",
		"rate.slack":                 0,
		"rate.min_spacing":           DefaultMinSpacing,
		"rate.warmup.period":         time.Duration(0),
		"rate.warmup.cold_factor":    DefaultColdFactor,
		"rate.global":                false,
		"rate.adaptive.min":          "",
		"rate.adaptive.cooldown":     DefaultAdaptiveCooldown,
		"rate.adaptive.headers":      DefaultAdaptiveHeaders,
		"rate.quota.count":           0,
		"rate.quota.per":             DefaultQuotaPer,
		"task.timeout":               DefaultTaskTimeout,
		"task.max_in_flight":         DefaultMaxInFlight,
		"task.retry.backoff":         DefaultBackoff(),
		"task.retry.retry_after":     DefaultRetryAfter,
		"task.retry.max_delay":       DefaultMaxDelay,
		"sink.method":                DefaultSinkMethod,
		"sink.success_status":        DefaultSuccessStatus(),
		"sink.dedup_window":          time.Duration(0),
		"sink.auth.kind":             DefaultSinkAuthKind,

		"task.breaker.failure_ratio": 0.0, // off
		"task.breaker.min_attempts":  DefaultBreakerMinAttempts,
		"task.breaker.window":        DefaultBreakerWindow,
		"task.breaker.probe_every":   DefaultBreakerProbeEvery,
	}
}

// topDefaults is the table of defaults outside the lanes.
func topDefaults() map[string]any {
	return map[string]any{
		"nats.embedded.listen":         DefaultEmbeddedListen,
		"nats.creds":                   "",
		"nats.tls.ca_file":             "",
		"nats.tls.cert_file":           "",
		"nats.tls.key_file":            "",
		"nats.embedded.store_dir":      DefaultEmbeddedStoreDir,
		"admin.listen":                 DefaultAdminListen,
		"admin.token":                  "",
		"log.level":                    DefaultLogLevel,
		"log.format":                   DefaultLogFormat,
		"shutdown.drain_timeout":       DefaultDrainTimeout,
		"redis.replicas_hint":          DefaultReplicasHint,
		"redis.key_prefix":             DefaultRedisKeyPrefix,
		"redis.timeout":                DefaultRedisTimeout,
		"dead_letter_stream.max_age":   DefaultDeadLetterStreamMaxAge,
		"dead_letter_stream.max_bytes": int64(0),
	}
}
