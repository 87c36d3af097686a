// Package metrics defines shaper's Prometheus metrics (SPEC §6) on a registry
// owned by the daemon. Every series of every configured lane, and of every
// listed label value, exists from the start with value 0, so dashboards and
// alerts never see a missing series. Labels come only from bounded sets: lane,
// outcome, reason.
package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/shaper-dev/shaper/shaper"
)

// Label values of the bounded sets (SPEC §6): the domain words live in
// package shaper; metrics only prints them.
var (
	// DeliveryOutcomes label shaper_deliveries_total.
	DeliveryOutcomes = shaper.DeliveryOutcomes
	// TaskOutcomes label shaper_task_duration_seconds.
	TaskOutcomes = shaper.TaskOutcomes
	// DeadLetterReasons label shaper_dead_letters_total.
	DeadLetterReasons = shaper.DeadLetterReasons
	// RetryReasons label shaper_retries_total.
	RetryReasons = shaper.RetryReasons
	// FairClasses label shaper_fair_queue_wait_seconds: "top" (the busiest
	// key) and "rest", never the key itself (bounded cardinality).
	FairClasses = shaper.FairClasses
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
	// SlotsDropped is shaper_global_slots_dropped_total (rate.global): the
	// shared schedule's slots this replica held and did not use because
	// its departure came later than shaper.SlotTolerance after them.
	SlotsDropped *prometheus.CounterVec
	// ScheduleDelayed is shaper_global_schedule_delayed_seconds_total
	// (rate.global): how far this replica moved the shared schedule's
	// slots not granted yet, in seconds, after its requests reached the
	// wire late (drain.ScheduleShifter).
	ScheduleDelayed *prometheus.CounterVec
	// LatenessForgiven is shaper_departure_lateness_forgiven_seconds_total
	// (SPEC G1), by cause: the seconds the pacer's schedule gave up, to
	// departures later than the make-up allows (late) and to requests that
	// reached the wire late (wire); shaper.Pacer.TakeForgiven.
	LatenessForgiven *prometheus.CounterVec
	// Overtaken is shaper_departures_overtaken_total (SPEC G1 at the
	// downstream): requests whose write was held past the wire wait while
	// later ones left, and that departed again before being written.
	Overtaken *prometheus.CounterVec
	// BreakerOpen is shaper_breaker_open (SPEC §3 Breaker).
	BreakerOpen *prometheus.GaugeVec
	// FairActiveKeys is shaper_fair_active_keys (bucket.fair_key): keys
	// with messages waiting.
	FairActiveKeys *prometheus.GaugeVec
	// FairQueueWait is shaper_fair_queue_wait_seconds{lane,class}: the
	// queue wait of a fair lane's departures by key class (FairClasses).
	FairQueueWait *prometheus.HistogramVec

	// ReloadSuccessful is shaper_config_last_reload_successful: 1 when the
	// last configuration loaded (at start or by a reload: SIGHUP, a change
	// of the file) was valid and applied, 0 when it was rejected and the
	// running one stayed. Named as Prometheus and Alertmanager name theirs.
	// 0 until the daemon sets it with [Metrics.ConfigLoaded].
	ReloadSuccessful prometheus.Gauge
	// ReloadSuccessTime is shaper_config_last_reload_success_timestamp_seconds:
	// the Unix time in seconds of the last configuration applied.
	ReloadSuccessTime prometheus.Gauge

	reg    prometheus.Registerer
	mu     sync.Mutex
	pacing map[string]*pacing // by lane
}

// pacing holds a lane's pacing histograms, whose buckets follow the lane's
// interval; they are collectors of their own (the lane as a constant label).
type pacing struct {
	lateness, gap prometheus.Histogram
}

// LatenessBuckets returns the buckets of shaper_departure_lateness_seconds
// for a lane at limit messages per second: steps of 1 % of the interval up to
// 10 %, then coarser up to 10 intervals, then 1 s and 10 s for stalls. The
// 1 % steps let the alert on a p99 above 5 % of an interval be read exactly.
func LatenessBuckets(limit float64) []float64 {
	iv := intervalSeconds(limit)
	var b []float64
	for _, f := range []float64{0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1,
		0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10} {
		b = append(b, roundSig(f*iv))
	}
	return appendAbove(b, 1, 10)
}

// GapBuckets returns the buckets of shaper_departure_gap_seconds for a lane
// at limit messages per second: 1 % of the interval around it (0.9 to 1.1
// intervals, where min_spacing and lateness show), coarser outside.
func GapBuckets(limit float64) []float64 {
	iv := intervalSeconds(limit)
	var b []float64
	for _, f := range []float64{0.01, 0.1, 0.25, 0.5, 0.75, 0.85,
		0.9, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1, 1.01, 1.02, 1.03, 1.04, 1.05, 1.1,
		1.25, 1.5, 2, 5, 10} {
		b = append(b, roundSig(f*iv))
	}
	return appendAbove(b, 60, 600)
}

func intervalSeconds(limit float64) float64 {
	if !(limit > 0) {
		limit = 1
	}
	return 1 / limit
}

// roundSig rounds v to 9 significant digits, so that bucket bounds print as
// le="0.009" rather than le="0.009000000000000001".
func roundSig(v float64) float64 {
	r, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 9, 64), 64)
	if err != nil {
		return v
	}
	return r
}

// appendAbove appends the given bounds that are above the last one.
func appendAbove(b []float64, more ...float64) []float64 {
	for _, v := range more {
		if v > b[len(b)-1] {
			b = append(b, v)
		}
	}
	return b
}

// e12 is the E12 series of preferred numbers: neighbours are at most 25 %
// apart (1.2 → 1.5), and they print as round numbers.
var e12 = []float64{1, 1.2, 1.5, 1.8, 2.2, 2.7, 3.3, 3.9, 4.7, 5.6, 6.8, 8.2}

// QueueWaitBuckets returns the buckets of shaper_queue_wait_seconds, in
// seconds: 1 ms to 50 ms coarsely (a wait of a few intervals), then the E12
// series from 0.1 s to 820 s, so that any wait in that range lies in a
// bucket whose bounds are at most 25 % apart, then 1000 s to 1 h. The waits
// a full bucket produces, capacity / limit (SPEC G7: 1,000 at 100/s is
// 10 s, at 1/s 1,000 s), fall in the dense range; with the earlier
// 10 s → 30 s step a real p99 of 14 s read as 28.8 s (issue 12). The
// histogram is also a native one (factor 1.1) for scrapers that ask for it.
func QueueWaitBuckets() []float64 {
	b := []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05}
	for _, decade := range []float64{0.1, 1, 10, 100} {
		for _, m := range e12 {
			b = append(b, roundSig(m*decade))
		}
	}
	return append(b, 1000, 1200, 1800, 2700, 3600)
}

// New creates the metrics on reg (never the global default registerer).
func New(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	lane := []string{"lane"}
	return &Metrics{
		BucketDepth:    f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_bucket_depth_messages", Help: "Messages waiting in the bucket for their departure."}, lane),
		BucketCapacity: f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_bucket_capacity_messages", Help: "Configured bucket capacity in messages."}, lane),
		RateLimit:      f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_rate_limit_per_second", Help: "Current effective departure rate in messages per second (warmup, pause, adaptive rate and fallback included)."}, lane),
		InFlight:       f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_in_flight_tasks", Help: "Tasks (sink calls) running now."}, lane),
		Admitted:       f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_admitted_messages_total", Help: "Messages admitted into the bucket."}, lane),
		Departures:     f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_departures_total", Help: "Messages that left the bucket and became a task."}, lane),
		Deliveries:     f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_deliveries_total", Help: "Finished tasks by what they led to: success (acked), retry (nak'd), dead_letter, duplicate_skipped (acked without a sink call: key already delivered, sink.dedup_window)."}, []string{"lane", "outcome"}),
		DeadLetters:    f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_dead_letters_total", Help: "Messages published to the dead-letter subject, by reason."}, []string{"lane", "reason"}),
		Retries:        f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_retries_total", Help: "Messages handed back for redelivery, by reason: error, timeout, rate_limited (downstream pushback), drain (shutdown leftovers), not_before (held until Shaper-Not-Before)."}, []string{"lane", "reason"}),
		QueueWait: f.NewHistogramVec(prometheus.HistogramOpts{Name: "shaper_queue_wait_seconds", Help: "Time from admission into the bucket to departure, in seconds.",
			Buckets: QueueWaitBuckets(), NativeHistogramBucketFactor: 1.1, NativeHistogramMaxBucketNumber: 160}, lane),
		TaskDuration: f.NewHistogramVec(prometheus.HistogramOpts{Name: "shaper_task_duration_seconds", Help: "Sink call duration in seconds, by outcome: success, error, timeout.", Buckets: prometheus.DefBuckets}, []string{"lane", "outcome"}),
		Paused:       f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_lane_paused", Help: "1 while the lane's departures are paused: a downstream's Retry-After or spent rate-limit budget, a spent quota, or an operator's pause."}, lane),
		Fallback:     f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_global_limiter_fallback", Help: "1 while Redis is unreachable and the lane paces locally at limit/replicas_hint."}, lane),
		Redelivered:  f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_redelivered_messages_total", Help: "Messages received with a delivery count above 1."}, lane),
		SlotsDropped: f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_global_slots_dropped_total",
			Help: "Slots of the shared schedule (rate.global) this replica held and did not use: its departure came later than the slot tolerance after them (a late wake-up, a stall). The schedule makes up part of them; the rest is the shared rate's shortfall."}, lane),
		ScheduleDelayed: f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_global_schedule_delayed_seconds_total",
			Help: "Seconds by which this replica moved the shared schedule's slots not granted yet after its requests reached the wire later than the others (rate.global): rate given up so that the downstream's windows hold."}, lane),
		LatenessForgiven: f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_departure_lateness_forgiven_seconds_total",
			Help: "Seconds the lane's schedule gave up, by cause: late (departures later than the make-up allows: a waiter that woke late, a stalled process) and wire (requests that reached the wire late, so the next departure was pushed back). Under a backlog the lane falls short of its limit by about this × the limit."}, []string{"lane", "cause"}),
		Overtaken: f.NewCounterVec(prometheus.CounterOpts{Name: "shaper_departures_overtaken_total",
			Help: "Requests whose write was held longer than the wire wait (50 ms: a slow dial or TLS handshake) while later requests left, and that took a departure of their own before being written, so that they do not reach the downstream among later ones. Each leaves one departure slot unused."}, lane),
		ReloadSuccessful: f.NewGauge(prometheus.GaugeOpts{Name: "shaper_config_last_reload_successful",
			Help: "1 when the last configuration loaded (start, SIGHUP, a change of the file) was valid and applied, 0 when it was rejected and the running one stayed."}),
		ReloadSuccessTime: f.NewGauge(prometheus.GaugeOpts{Name: "shaper_config_last_reload_success_timestamp_seconds",
			Help: "Unix time in seconds of the last configuration applied (start or reload)."}),
		BreakerOpen:    f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_breaker_open", Help: "1 while the lane's breaker is open (departures stopped but for probes, or held after a 410 Gone until an operator resumes the lane), else 0."}, lane),
		FairActiveKeys: f.NewGaugeVec(prometheus.GaugeOpts{Name: "shaper_fair_active_keys", Help: "Keys with messages waiting in a fair lane's bucket (bucket.fair_key); 0 or 1 for a FIFO lane."}, lane),
		FairQueueWait: f.NewHistogramVec(prometheus.HistogramOpts{Name: "shaper_fair_queue_wait_seconds",
			Help:    "Queue wait of a fair lane's departures in seconds, by key class: top (the key holding the most messages, more than one, when it departed) or rest.",
			Buckets: QueueWaitBuckets(), NativeHistogramBucketFactor: 1.1, NativeHistogramMaxBucketNumber: 160}, []string{"lane", "class"}),
		reg:    reg,
		pacing: map[string]*pacing{},
	}
}

// ConfigLoaded records the outcome of loading the configuration at at: a
// valid one applied (ok; its time is kept) or one rejected (the time of the
// last success stays).
func (m *Metrics) ConfigLoaded(ok bool, at time.Time) {
	if !ok {
		m.ReloadSuccessful.Set(0)
		return
	}
	m.ReloadSuccessful.Set(1)
	m.ReloadSuccessTime.Set(float64(at.UnixNano()) / 1e9)
}

// Pacing metric names (SPEC §6).
const (
	LatenessName = "shaper_departure_lateness_seconds"
	GapName      = "shaper_departure_gap_seconds"
)

// lanePacing returns lane name's pacing histograms, created with buckets for
// limit on first use (later calls reuse them, whatever their limit: a hot
// reload keeps the series and their buckets).
func (m *Metrics) lanePacing(name string, limit float64) *pacing {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.pacing[name]; ok {
		return p
	}
	f := promauto.With(m.reg)
	labels := prometheus.Labels{"lane": name}
	p := &pacing{
		lateness: f.NewHistogram(prometheus.HistogramOpts{Name: LatenessName, ConstLabels: labels, Buckets: LatenessBuckets(limit),
			Help: "How late each departure left against its scheduled instant, in seconds (buckets in steps of 1 % of the lane's interval)."}),
		gap: f.NewHistogram(prometheus.HistogramOpts{Name: GapName, ConstLabels: labels, Buckets: GapBuckets(limit),
			Help: "Time between consecutive departures of the lane, in seconds (buckets in steps of 1 % of the interval near it)."}),
	}
	m.pacing[name] = p
	return p
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
	// SlotsDropped counts the shared slots this replica dropped (rate.global).
	SlotsDropped prometheus.Counter
	// ScheduleDelayed adds the seconds by which this replica moved the
	// shared schedule after late writes (rate.global).
	ScheduleDelayed prometheus.Counter
	// ForgivenLate and ForgivenWire add the seconds the schedule gave up
	// to late departures and to late wire reports (shaper.Pacer.TakeForgiven).
	ForgivenLate, ForgivenWire prometheus.Counter
	// Overtaken counts requests that departed again after later ones
	// overtook them (drain/gate.go).
	Overtaken prometheus.Counter
	// BreakerOpen is 1 while the lane's breaker is open (SPEC §3 Breaker).
	BreakerOpen prometheus.Gauge
	// FairActiveKeys is the number of keys waiting (bucket.fair_key).
	FairActiveKeys prometheus.Gauge
	// FairQueueWait observes a fair lane's queue waits by key class.
	FairQueueWait map[string]prometheus.Observer
	// Lateness observes how late each departure left (SPEC §6).
	Lateness prometheus.Observer
	// Gap observes the time between consecutive departures (SPEC §6).
	Gap prometheus.Observer
}

// Lane returns the series of lane name, creating all of them now; limit is
// the lane's rate in messages per second, which sets the buckets of the
// pacing histograms when they are first created.
func (m *Metrics) Lane(name string, limit float64) *Lane {
	p := m.lanePacing(name, limit)
	l := &Lane{
		Lateness:        p.lateness,
		Gap:             p.gap,
		BucketDepth:     m.BucketDepth.WithLabelValues(name),
		BucketCapacity:  m.BucketCapacity.WithLabelValues(name),
		RateLimit:       m.RateLimit.WithLabelValues(name),
		InFlight:        m.InFlight.WithLabelValues(name),
		Admitted:        m.Admitted.WithLabelValues(name),
		Departures:      m.Departures.WithLabelValues(name),
		Deliveries:      map[string]prometheus.Counter{},
		DeadLetters:     map[string]prometheus.Counter{},
		Retries:         map[string]prometheus.Counter{},
		QueueWait:       m.QueueWait.WithLabelValues(name),
		TaskDuration:    map[string]prometheus.Observer{},
		Paused:          m.Paused.WithLabelValues(name),
		Fallback:        m.Fallback.WithLabelValues(name),
		Redelivered:     m.Redelivered.WithLabelValues(name),
		SlotsDropped:    m.SlotsDropped.WithLabelValues(name),
		ScheduleDelayed: m.ScheduleDelayed.WithLabelValues(name),
		ForgivenLate:    m.LatenessForgiven.WithLabelValues(name, "late"),
		ForgivenWire:    m.LatenessForgiven.WithLabelValues(name, "wire"),
		Overtaken:       m.Overtaken.WithLabelValues(name),
		BreakerOpen:     m.BreakerOpen.WithLabelValues(name),
		FairActiveKeys:  m.FairActiveKeys.WithLabelValues(name),
		FairQueueWait:   map[string]prometheus.Observer{},
	}
	for _, c := range FairClasses {
		l.FairQueueWait[c] = m.FairQueueWait.WithLabelValues(name, c)
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
func Discard(name string, limit float64) *Lane {
	return New(prometheus.NewRegistry()).Lane(name, limit)
}

// Remove deletes every series of lane name (a lane removed by a reload), so
// that dashboards do not show a lane that no longer exists.
func (m *Metrics) Remove(name string) {
	match := prometheus.Labels{"lane": name}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{
		m.BucketDepth, m.BucketCapacity, m.RateLimit, m.InFlight, m.Admitted, m.Departures,
		m.Deliveries, m.DeadLetters, m.Retries, m.QueueWait, m.TaskDuration, m.Paused,
		m.Fallback, m.Redelivered, m.SlotsDropped, m.ScheduleDelayed, m.LatenessForgiven, m.Overtaken, m.BreakerOpen, m.FairActiveKeys, m.FairQueueWait,
	} {
		v.DeletePartialMatch(match)
	}
	m.mu.Lock()
	if p, ok := m.pacing[name]; ok {
		m.reg.Unregister(p.lateness)
		m.reg.Unregister(p.gap)
		delete(m.pacing, name)
	}
	m.mu.Unlock()
}
