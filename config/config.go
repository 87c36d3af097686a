// Package config defines shaper's configuration (SPEC §4), loads it with viper
// from a file, SHAPER_* environment variables and flags, and validates it. Every
// problem is reported with its key path so that `shaper validate` can list them
// all at once.
package config

import (
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Config is the whole daemon configuration. Field tags give the key names of
// SPEC §4; the loader rejects unknown keys. Build one with [Load], which
// applies the defaults and validates it; a Config built by hand must set
// every field (see the Default* constants) before [Validate] accepts it.
// Secret-bearing values hold the expanded secret: log [Config.Redacted],
// never the Config itself.
type Config struct {
	NATS     NATS     `mapstructure:"nats"`
	Redis    Redis    `mapstructure:"redis"`
	Admin    Admin    `mapstructure:"admin"`
	Log      Log      `mapstructure:"log"`
	Shutdown Shutdown `mapstructure:"shutdown"`
	// DeadLetterStream limits the dead-letter streams shaper creates.
	DeadLetterStream DeadLetterStream `mapstructure:"dead_letter_stream"`
	// Downstreams maps lane names ([a-z0-9_-]+, lower case) to lanes. At
	// least one lane is required.
	Downstreams map[string]Lane `mapstructure:"downstreams"`

	// templates maps the key path of every value Load expanded from ${ENV}
	// references to the text before expansion, so that error messages and
	// Redacted can show the reference instead of the secret.
	templates map[string]string
}

// NATS selects an external server (URL) or the embedded one (URL "").
type NATS struct {
	// URL is the server to connect to: nats://, tls://, ws:// or wss://,
	// or a comma-separated list of them; may use ${ENV} (credentials).
	// "" (default) starts the embedded server.
	URL string `mapstructure:"url"`
	// Creds is a .creds file (the user's JWT and nkey seed, as nsc writes
	// it) to authenticate with; "" = none. Only with URL. The file is read
	// at every (re)connect; its content is never logged.
	Creds string `mapstructure:"creds"`
	// TLS is the CA and client certificate of the connection to URL.
	TLS      NATSTLS  `mapstructure:"tls"`
	Embedded Embedded `mapstructure:"embedded"`
}

// NATSTLS configures TLS to the NATS servers. Any file set turns TLS on
// (with nats:// URLs too). The files are read again at every (re)connect,
// so a renewed certificate or CA is used from the next connection on.
type NATSTLS struct {
	// CAFile is a PEM file of the CAs that sign the servers' certificates;
	// "" = the system's roots.
	CAFile string `mapstructure:"ca_file"`
	// CertFile and KeyFile are the client certificate and its key (PEM),
	// for servers that verify clients (mTLS); both or neither.
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
}

// Enabled reports whether any TLS file is set.
func (t NATSTLS) Enabled() bool { return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" }

// Embedded configures the in-process NATS server with JetStream.
type Embedded struct {
	// Listen is host:port; port 0 picks a free port (it is logged).
	// Default 127.0.0.1:4222.
	Listen string `mapstructure:"listen"`
	// StoreDir is where JetStream keeps streams and consumer state.
	// Default ./data/nats; required when URL is "".
	StoreDir string `mapstructure:"store_dir"`
}

// Redis configures the shared store of global rates ("" address = none),
// see docs/scaling.md.
type Redis struct {
	// Addr is host:port or a redis:// or rediss:// URL, or a
	// comma-separated list of them: several addresses (or Cluster true) mean
	// a Redis Cluster, MasterName means Sentinel addresses. May use ${ENV}.
	// Required by lanes with rate.global. Default "" (no Redis).
	Addr string `mapstructure:"addr"`
	// Username is the ACL user (Redis 6+); "" = default user. May use ${ENV}.
	Username string `mapstructure:"username"`
	// Password authenticates (AUTH); a secret: give it as a ${ENV}
	// reference. Default "".
	Password string `mapstructure:"password"`
	// DB is the database index. ≥ 0, default 0; must be 0 for a cluster.
	DB int `mapstructure:"db"`
	// TLS connects with TLS (also implied by a rediss:// address).
	// Default false.
	TLS bool `mapstructure:"tls"`
	// Cluster treats a single address as a Redis Cluster seed. Default
	// false (several addresses are a cluster anyway).
	Cluster bool `mapstructure:"cluster"`
	// MasterName is the Sentinel master name; Addr then lists sentinels.
	// Default "" (no Sentinel).
	MasterName string `mapstructure:"master_name"`
	// KeyPrefix starts every key shaper writes ("<prefix>:<lane>" inside a
	// {hash tag}). No spaces, braces or control characters; default
	// "shaper".
	KeyPrefix string `mapstructure:"key_prefix"`
	// Timeout bounds a dial and each call to Redis; past it the lane paces
	// locally (fallback). > 0, default 50ms.
	Timeout time.Duration `mapstructure:"timeout"`
	// ReplicasHint is the number of replicas sharing global lanes; while
	// Redis is unreachable each paces limit / ReplicasHint. ≥ 1, default 1.
	ReplicasHint int `mapstructure:"replicas_hint"`
}

// Admin configures the HTTP endpoint serving /metrics, /healthz and /readyz.
type Admin struct {
	// Listen is host:port (port 0 = any free port). Default 127.0.0.1:9464.
	Listen string `mapstructure:"listen"`
	// Token, when set, is required as "Authorization: Bearer <token>" by the
	// admin API's write endpoints (SPEC §6). Use ${ENV}; it is never logged
	// or shown. Required when Listen is not a loopback address.
	Token string `mapstructure:"token"`
}

// Log configures log/slog.
type Log struct {
	Level  string `mapstructure:"level"`  // debug|info|warn|error, default info
	Format string `mapstructure:"format"` // text|json, default text
}

// Shutdown configures the graceful drain.
type Shutdown struct {
	// DrainTimeout bounds how long the buckets keep departing after a signal.
	// > 0, default 30s.
	DrainTimeout time.Duration `mapstructure:"drain_timeout"`
}

// Lane is one downstream (SPEC §1).
type Lane struct {
	Source     Source     `mapstructure:"source"`
	Bucket     Bucket     `mapstructure:"bucket"`
	Rate       Rate       `mapstructure:"rate"`
	Task       Task       `mapstructure:"task"`
	DeadLetter DeadLetter `mapstructure:"dead_letter"`
	Sink       Sink       `mapstructure:"sink"`
}

// Source is the JetStream stream and durable pull consumer of a lane.
type Source struct {
	// Stream is the JetStream stream (created with Subjects when missing).
	// Required; no spaces, '.', '*', '>', '/' or '\'.
	Stream string `mapstructure:"stream"`
	// Subjects are the consumer's filter subjects. At least one; they must
	// not overlap each other nor the subjects of another lane.
	Subjects []string `mapstructure:"subjects"`
	// Consumer is the durable consumer name; Load turns "" into
	// shaper-<lane>. Unique per stream.
	Consumer string `mapstructure:"consumer"`
	// AckWait is the server's redelivery deadline. > 0 and > Task.Timeout;
	// default 60s. Validate warns when it is shorter than the worst-case
	// wait (SPEC G7).
	AckWait time.Duration `mapstructure:"ack_wait"`
	// MaxDeliver is the number of attempts before dead letter
	// "max_deliver". ≥ 1, or -1 for unlimited; default 5.
	MaxDeliver int `mapstructure:"max_deliver"`
	// MaxAckPending caps the messages the server hands out unacknowledged.
	// ≥ 0; 0 (default) = capacity + max_in_flight (block) or 2×capacity
	// (reject), see [Lane.EffectiveMaxAckPending].
	MaxAckPending int `mapstructure:"max_ack_pending"`
	// MaxMessageBytes dead-letters (reason "invalid") a message whose
	// payload is larger, instead of sending it downstream. ≥ 0; 0 (default)
	// = no limit.
	MaxMessageBytes int `mapstructure:"max_message_bytes"`
	// Retention limits the stream when shaper creates it (config/retention.go).
	Retention Retention `mapstructure:"retention"`
	// Standby makes the replicas of the lane a NATS priority group with a
	// pinned client (SPEC §3 Standby, nats-server 2.11+): one replica paces
	// and delivers, the others hold nothing and take over within
	// sources.StandbyTakeover when it stops or dies. Default false.
	Standby bool `mapstructure:"standby"`
	// Replicas is the number of replicas (R) of the stream and the consumer
	// when shaper creates them on a JetStream cluster. 1..5, default 1. An
	// existing stream keeps its replicas (a warning when they differ).
	Replicas int `mapstructure:"replicas"`
}

// Bucket is the bounded FIFO of a lane.
type Bucket struct {
	// Capacity is the number of messages the bucket holds. ≥ 1, default 1000.
	Capacity int `mapstructure:"capacity"`
	// Overflow is OverflowBlock (default) or OverflowReject.
	Overflow string `mapstructure:"overflow"`
	// MaxWait dead-letters ("max_wait") a message whose projected wait
	// exceeds it. ≥ 0; 0 (default) = no limit; > 0 only with overflow reject.
	MaxWait time.Duration `mapstructure:"max_wait"`
	// MaxAge dead-letters ("expired") a message older than this at
	// departure. ≥ 0; 0 (default) = no limit.
	MaxAge time.Duration `mapstructure:"max_age"`
	// FairKey turns on fair queueing (SPEC §3 Fairness): "" (default) = one
	// FIFO; a header name, or subject:N (subject token N from 0), gives each
	// message its key, and the keys are served by round robin
	// (shaper.FairKeyFunc). A change restarts the lane on reload.
	FairKey string `mapstructure:"fair_key"`
}

// Rate is the pacer's configuration.
type Rate struct {
	// Limit is the departure rate in messages per second. Required,
	// positive and finite; written N/s, N/m, N/h or a number per second.
	Limit shaper.Limit `mapstructure:"limit"`
	// Slack is how many departures an idle lane may bank. ≥ 0, default 0.
	Slack int `mapstructure:"slack"`
	// MinSpacing is, in intervals (1/Limit), how close two consecutive
	// departures may come when the pacer makes up a late departure (SPEC
	// G1, Spacing). In (0, 1], default 0.95; 1.0 never leaves early.
	MinSpacing float64 `mapstructure:"min_spacing"`
	// Warmup is the cold-start ramp; off by default.
	Warmup Warmup `mapstructure:"warmup"`
	// Global shares Limit across replicas through Redis; needs redis.addr.
	// Default false.
	Global bool `mapstructure:"global"`
	// Adaptive lowers and raises the rate between a minimum and Limit from
	// the downstream's answers (SPEC §3 Adaptive rate); off by default.
	Adaptive Adaptive `mapstructure:"adaptive"`
	// Quota caps the departures of any sliding window beside the rate
	// (SPEC §3 Quota); off by default.
	Quota Quota `mapstructure:"quota"`
}

// Warmup configures the cold-start ramp (SPEC §3 Warmup).
type Warmup struct {
	// Period is the time from the cold rate to Limit. ≥ 0; 0s (default) = off.
	Period time.Duration `mapstructure:"period"`
	// ColdFactor divides Limit to give the cold rate. ≥ 1, default 3.
	ColdFactor float64 `mapstructure:"cold_factor"`
}

// Task configures delivery attempts.
type Task struct {
	// Timeout bounds one sink call. > 0, default 5s.
	Timeout time.Duration `mapstructure:"timeout"`
	// MaxInFlight is the number of sink calls running at once. ≥ 1, default 8.
	MaxInFlight int   `mapstructure:"max_in_flight"`
	Retry       Retry `mapstructure:"retry"`
	// Breaker stops departures against a failing downstream (SPEC §3
	// Breaker); off by default.
	Breaker Breaker `mapstructure:"breaker"`
}

// Breaker configures a lane's breaker (SPEC §3 Breaker, shaper.Breaker).
type Breaker struct {
	// FailureRatio is the share of failed attempts (network error, timeout,
	// 5xx) among those that ended within Window at which the lane opens.
	// In [0, 1]; 0 (default) = off.
	FailureRatio float64 `mapstructure:"failure_ratio"`
	// MinAttempts is how many attempts must have ended within Window before
	// the ratio is judged. ≥ 1, default 20.
	MinAttempts int `mapstructure:"min_attempts"`
	// Window is how far back attempts count (sliding). > 0, default 30s.
	Window time.Duration `mapstructure:"window"`
	// ProbeEvery is the time between probe departures while open. > 0,
	// default 10s.
	ProbeEvery time.Duration `mapstructure:"probe_every"`
}

// Retry configures the nak delays of failed attempts.
type Retry struct {
	// Backoff is the nak delay indexed by delivery count, the last one
	// repeating. At least one, each > 0; default [1s, 5s, 30s].
	Backoff []time.Duration `mapstructure:"backoff"`
	// RetryAfter honours a response's Retry-After. Default true.
	RetryAfter bool `mapstructure:"retry_after"`
	// MaxDelay caps a Retry-After delay. > 0, default 5m.
	MaxDelay time.Duration `mapstructure:"max_delay"`
}

// DeadLetter configures where undeliverable messages go.
type DeadLetter struct {
	// Subject is where dead letters are published; Load turns "" into
	// shaper.dead.<lane>. No wildcards, and no lane may consume it.
	Subject string `mapstructure:"subject"`
}

// Sink configures the downstream.
type Sink struct {
	// Kind is SinkHTTP, SinkNATS or SinkLog. Required.
	Kind string `mapstructure:"kind"`
	// URL is the http:// or https:// URL of an http sink (required there);
	// may use ${ENV}. Its path and query may use {header:NAME} and
	// {subject:N}, filled from each message (sinks.URLTemplate).
	URL string `mapstructure:"url"`
	// Method is the HTTP method (an RFC 9110 token). Default POST.
	Method string `mapstructure:"method"`
	// Headers are sent on every HTTP request; values may use ${ENV} and are
	// secrets. Names are lower-cased by the loader (HTTP names are
	// case-insensitive); names the sink sets itself are rejected.
	Headers map[string]string `mapstructure:"headers"`
	// SuccessStatus lists the statuses that mean delivered: codes ("200",
	// "204") or classes ("2xx"). At least one; default ["2xx"].
	SuccessStatus []string `mapstructure:"success_status"`
	// RetryableStatus lists statuses to retry besides 408, 429 and 5xx
	// (SPEC §3 "a status listed as retryable"), e.g. [409, 425]. Default none.
	RetryableStatus []int `mapstructure:"retryable_status"`
	// Subject is where a nats sink publishes (required there); no wildcards,
	// not consumed by the same lane.
	Subject string `mapstructure:"subject"`
	// DedupWindow is how long the key of a delivered message is remembered
	// (SPEC §3 Delivered-key dedup; config/dedup.go). ≥ 0; 0 (default) = off.
	DedupWindow time.Duration `mapstructure:"dedup_window"`
	// Signing signs an http sink's requests (Standard Webhooks); off by
	// default (config/signing.go).
	Signing SinkSigning `mapstructure:"signing"`
	// Auth is the http sink's own Authorization (config/sink_auth.go).
	Auth SinkAuth `mapstructure:"auth"`
	// TLS is the http sink's CA bundle and client certificate.
	TLS SinkTLS `mapstructure:"tls"`
}
