// Package metrics defines shaper's Prometheus metrics (SPEC §6) on a registry
// owned by the daemon. Every series of every configured lane, and of every
// listed label value, exists from the start with value 0, so dashboards and
// alerts never see a missing series. Labels come only from bounded sets: lane,
// outcome, reason.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Label values of the bounded sets (SPEC §6).
var (
	// DeliveryOutcomes label shaper_deliveries_total.
	DeliveryOutcomes = []string{OutcomeSuccess, OutcomeRetry, OutcomeDeadLetter}
	// TaskOutcomes label shaper_task_duration_seconds.
	TaskOutcomes = []string{OutcomeSuccess, OutcomeError, OutcomeTimeout}
	// DeadLetterReasons label shaper_dead_letters_total.
	DeadLetterReasons = []string{ReasonOverflow, ReasonMaxWait, ReasonExpired, ReasonMaxDeliver, ReasonRejectedBySink, ReasonInvalid}
	// RetryReasons label shaper_retries_total: a failure of the message
	// ("error", "timeout") or a downstream's pushback ("rate_limited", case C17).
	RetryReasons = []string{OutcomeError, OutcomeTimeout, RetryRateLimited, RetryDrain}
)

// Outcome and reason label values.
const (
	OutcomeSuccess    = "success"
	OutcomeRetry      = "retry"
	OutcomeDeadLetter = "dead_letter"
	OutcomeError      = "error"
	OutcomeTimeout    = "timeout"

	ReasonOverflow       = "overflow"
	ReasonMaxWait        = "max_wait"
	ReasonExpired        = "expired"
	ReasonMaxDeliver     = "max_deliver"
	ReasonRejectedBySink = "rejected_by_sink"
	ReasonInvalid        = "invalid"

	RetryRateLimited = "rate_limited"
	RetryDrain       = "drain"
)

// Metrics holds the metric vectors of all lanes.
type Metrics struct {
	BucketDepth    *prometheus.GaugeVec
	BucketCapacity *prometheus.GaugeVec
	RateLimit      *prometheus.GaugeVec
	InFlight       *prometheus.GaugeVec
	Admitted       *prometheus.CounterVec
	Departures     *prometheus.CounterVec
	Deliveries     *prometheus.CounterVec
	DeadLetters    *prometheus.CounterVec
	Retries        *prometheus.CounterVec
	QueueWait      *prometheus.HistogramVec
	TaskDuration   *prometheus.HistogramVec
	Paused         *prometheus.GaugeVec
	Fallback       *prometheus.GaugeVec
	Redelivered    *prometheus.CounterVec
}

// New creates the metrics on reg (never the global default registerer).
func New(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	lane := []string{"lane"}
	waitBuckets := []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	return &Metrics{
		BucketDepth:    f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_bucket_depth_messages", Help: "Messages waiting in the bucket for their departure."}, lane),
		BucketCapacity: f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_bucket_capacity_messages", Help: "Configured bucket capacity in messages."}, lane),
		RateLimit:      f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_rate_limit_per_second", Help: "Current effective departure rate in messages per second (warmup, pause and fallback included)."}, lane),
		InFlight:       f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_in_flight_tasks", Help: "Tasks (sink calls) running now."}, lane),
		Admitted:       f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_admitted_messages_total", Help: "Messages admitted into the bucket."}, lane),
		Departures:     f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_departures_total", Help: "Messages that left the bucket and became a task."}, lane),
		Deliveries:     f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_deliveries_total", Help: "Finished tasks by what they led to: success (acked), retry (nak'd), dead_letter."}, []string{"lane", "outcome"}),
		DeadLetters:    f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_dead_letters_total", Help: "Messages published to the dead-letter subject, by reason."}, []string{"lane", "reason"}),
		Retries:        f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_retries_total", Help: "Messages handed back for redelivery, by reason: error, timeout, rate_limited (downstream pushback), drain (shutdown leftovers)."}, []string{"lane", "reason"}),
		QueueWait:      f.NewHistogramVec(prometheus.HistogramOpts{Name: "shaper_queue_wait_seconds", Help: "Time from admission into the bucket to departure, in seconds.", Buckets: waitBuckets}, lane),
		TaskDuration:   f.NewHistogramVec(prometheus.HistogramOpts{Name: "shaper_task_duration_seconds", Help: "Sink call duration in seconds, by outcome: success, error, timeout.", Buckets: prometheus.DefBuckets}, []string{"lane", "outcome"}),
		Paused:         f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_lane_paused", Help: "1 while the lane's departures are paused by a downstream's Retry-After."}, lane),
		Fallback:       f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_global_limiter_fallback", Help: "1 while Redis is unreachable and the lane paces locally at limit/replicas_hint."}, lane),
		Redelivered:    f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_redelivered_messages_total", Help: "Messages received with a delivery count above 1."}, lane),
	}
}

// Lane is the set of series of one lane, created at once with value 0.
type Lane struct {
	BucketDepth    prometheus.Gauge
	BucketCapacity prometheus.Gauge
	RateLimit      prometheus.Gauge
	InFlight       prometheus.Gauge
	Admitted       prometheus.Counter
	Departures     prometheus.Counter
	Deliveries     map[string]prometheus.Counter // by outcome
	DeadLetters    map[string]prometheus.Counter // by reason
	Retries        map[string]prometheus.Counter // by reason
	QueueWait      prometheus.Observer
	TaskDuration   map[string]prometheus.Observer // by outcome
	Paused         prometheus.Gauge
	Fallback       prometheus.Gauge
	Redelivered    prometheus.Counter
}

// Lane returns the series of lane name, creating all of them now.
func (m *Metrics) Lane(name string) *Lane {
	l := &Lane{
		BucketDepth:    m.BucketDepth.WithLabelValues(name),
		BucketCapacity: m.BucketCapacity.WithLabelValues(name),
		RateLimit:      m.RateLimit.WithLabelValues(name),
		InFlight:       m.InFlight.WithLabelValues(name),
		Admitted:       m.Admitted.WithLabelValues(name),
		Departures:     m.Departures.WithLabelValues(name),
		Deliveries:     map[string]prometheus.Counter{},
		DeadLetters:    map[string]prometheus.Counter{},
		Retries:        map[string]prometheus.Counter{},
		QueueWait:      m.QueueWait.WithLabelValues(name),
		TaskDuration:   map[string]prometheus.Observer{},
		Paused:         m.Paused.WithLabelValues(name),
		Fallback:       m.Fallback.WithLabelValues(name),
		Redelivered:    m.Redelivered.WithLabelValues(name),
	}
	for _, o := range DeliveryOutcomes {
		l.Deliveries[o] = m.Deliveries.WithLabelValues(name, o)
	}
	for _, r := range DeadLetterReasons {
		l.DeadLetters[r] = m.DeadLetters.WithLabelValues(name, r)
	}
	for _, r := range RetryReasons {
		l.Retries[r] = m.Retries.WithLabelValues(name, r)
	}
	for _, o := range TaskOutcomes {
		l.TaskDuration[o] = m.TaskDuration.WithLabelValues(name, o)
	}
	return l
}

// Discard returns the series of lane name on a private registry, for tests
// and tools that do not export metrics.
func Discard(name string) *Lane { return New(prometheus.NewRegistry()).Lane(name) }

// Remove deletes every series of lane name (a lane removed by a reload), so
// that dashboards do not show a lane that no longer exists.
func (m *Metrics) Remove(name string) {
	match := prometheus.Labels{"lane": name}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{
		m.BucketDepth, m.BucketCapacity, m.RateLimit, m.InFlight, m.Admitted, m.Departures,
		m.Deliveries, m.DeadLetters, m.Retries, m.QueueWait, m.TaskDuration, m.Paused,
		m.Fallback, m.Redelivered,
	} {
		v.DeletePartialMatch(match)
	}
}
