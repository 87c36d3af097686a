package config

// The checks of one lane, section by section (validate.go runs them for
// each lane, then the rules across lanes).

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
)

// lane checks one lane, section by section: source, bucket, rate, task,
// dead letter, sink, and the ack-wait warning across them.
func (v *validator) lane(name string, l Lane) {
	k := func(rel string) string { return "downstreams." + name + "." + rel }
	nameOK := laneNameRE.MatchString(name)
	// Not v.check: its skip also covers a key under the lane that failed to
	// load (a rate of 0), which hid the name's problem (a new-user pass).
	if !nameOK && !v.p.failed["downstreams."+name] {
		v.p.add("downstreams."+name, "lane name must match %s, got %q", laneNamePattern, name)
	}

	v.laneSource(k, nameOK, l)
	v.laneBucket(k, l)
	v.laneRate(k, l)
	v.laneTask(k, l)
	v.laneDeadLetter(k, nameOK, l)
	v.sink(name, l)
	v.dedupWindow(k, l)
	v.ackWaitWarning(name, l)
}

// laneSource checks a lane's source keys; k makes a lane key path, nameOK
// says the lane's name is valid (the consumer's default derives from it).
func (v *validator) laneSource(k func(string) string, nameOK bool, l Lane) {
	if l.Source.Stream == "" {
		v.check(false, k("source.stream"), "required (a JetStream stream name, e.g. CALLBACKS)")
	} else if why := badName(l.Source.Stream); why != "" {
		v.check(false, k("source.stream"), "%q is not a valid stream name: %s", l.Source.Stream, why)
	}
	v.check(len(l.Source.Subjects) > 0, k("source.subjects"), "at least one subject is required")
	for i, s := range l.Source.Subjects {
		key := fmt.Sprintf("%s[%d]", k("source.subjects"), i)
		if why := badSubject(s); why != "" {
			v.check(false, key, "%q is not a valid subject: %s", s, why)
			continue
		}
		for j, prev := range l.Source.Subjects[:i] {
			if badSubject(prev) == "" && subjectsOverlap(s, prev) {
				v.check(false, key, "%q overlaps %q (source.subjects[%d]): a consumer's filters must not overlap", s, prev, j)
				break
			}
		}
	}
	if nameOK {
		if why := badName(l.Source.Consumer); why != "" {
			v.check(false, k("source.consumer"), "%q is not a valid consumer name: %s", l.Source.Consumer, why)
		}
	}
	v.check(l.Source.AckWait >= MinAckWait, k("source.ack_wait"),
		"must be at least %s, got %s: the lane keeps held messages with in-progress acks sent every ack_wait / 4 (SPEC G7), and a shorter one lets the server redeliver messages the lane still holds",
		MinAckWait, l.Source.AckWait)
	// No rule ties ack_wait to task.timeout: a running task keeps its
	// message with in-progress acks, so a sink call may outlive ack_wait
	// (SPEC G7, issue 13; TestTaskOutlivesAckWait). ackWaitWarning warns
	// when the worst-case hold, task.timeout included, is longer.
	v.check(l.Source.MaxDeliver >= 1 || l.Source.MaxDeliver == -1, k("source.max_deliver"),
		"must be ≥ 1, or -1 for unlimited, got %d", l.Source.MaxDeliver)
	v.check(l.Source.MaxAckPending >= 0, k("source.max_ack_pending"),
		"must be ≥ 0 (0 = derived from the bucket), got %d", l.Source.MaxAckPending)
	if mapn := l.Source.MaxAckPending; mapn > 0 && l.Task.MaxInFlight > 0 {
		// The server never hands out more than max_ack_pending messages:
		// below max_in_flight the task slots can never all be used.
		v.check(mapn >= l.Task.MaxInFlight, k("source.max_ack_pending"),
			"must be ≥ task.max_in_flight (%d), got %d: the server would never hand out enough messages to fill the task slots",
			l.Task.MaxInFlight, mapn)
		if need := l.Bucket.Capacity + l.Task.MaxInFlight; mapn >= l.Task.MaxInFlight && mapn < need && l.Bucket.Capacity > 0 {
			v.warn(k("source.max_ack_pending"), "%d is below bucket.capacity + task.max_in_flight (%d): the bucket can never fill", mapn, need)
		}
	}
	v.retention(k, l)
	v.check(l.Source.MaxMessageBytes >= 0, k("source.max_message_bytes"),
		"must be ≥ 0 (0 = no limit), got %d", l.Source.MaxMessageBytes)
	v.standby(k, l)
	v.check(l.Source.Replicas >= 1 && l.Source.Replicas <= 5, k("source.replicas"),
		"must be 1..5 (JetStream replicas), got %d", l.Source.Replicas)
}

// laneBucket checks a lane's bucket keys.
func (v *validator) laneBucket(k func(string) string, l Lane) {
	v.check(l.Bucket.Capacity >= 1, k("bucket.capacity"), "must be ≥ 1, got %d", l.Bucket.Capacity)
	overflowOK := l.Bucket.Overflow == OverflowBlock || l.Bucket.Overflow == OverflowReject
	v.check(overflowOK, k("bucket.overflow"), "must be block or reject, got %q", l.Bucket.Overflow)
	v.check(l.Bucket.MaxWait >= 0, k("bucket.max_wait"), "must be ≥ 0 (0 = no limit), got %s", l.Bucket.MaxWait)
	if l.Bucket.MaxWait > 0 && overflowOK && !v.p.skip(k("bucket.overflow")) {
		v.check(l.Bucket.Overflow == OverflowReject, k("bucket.max_wait"),
			"only applies with bucket.overflow reject (overflow is %q), got %s", l.Bucket.Overflow, l.Bucket.MaxWait)
	}
	v.check(l.Bucket.MaxAge >= 0, k("bucket.max_age"), "must be ≥ 0 (0 = no limit), got %s", l.Bucket.MaxAge)
	_, fairErr := shaper.FairKeyFunc(l.Bucket.FairKey)
	v.check(fairErr == nil, k("bucket.fair_key"),
		`must be "" (one FIFO), a header name or subject:N with N ≥ 0, got %q`, l.Bucket.FairKey)
}

// laneRate checks a lane's rate keys.
func (v *validator) laneRate(k func(string) string, l Lane) {
	limit := float64(l.Rate.Limit)
	switch {
	case limit == 0:
		v.check(false, k("rate.limit"), "required (e.g. 100/s)")
	case limit < 0 || math.IsNaN(limit) || math.IsInf(limit, 0):
		v.check(false, k("rate.limit"), "must be positive and finite, got %v", limit)
	case limit < MinLimit || limit > MaxLimit:
		// Outside this range the emission interval does not fit the
		// pacer's arithmetic (time.Duration spans 292 years) or is below
		// what a pull consumer can feed.
		v.check(false, k("rate.limit"), "must be between 1/24h and 1000000/s, got %v/s", limit)
	case limit > 10000:
		v.warn(k("rate.limit"), "%v/s is above 10,000/s, the highest rate SPEC G1 guarantees: expect small batches and a lower achieved rate", limit)
	}
	v.check(l.Rate.Slack >= 0, k("rate.slack"), "must be ≥ 0, got %d", l.Rate.Slack)
	if limit > 0 && !math.IsInf(limit, 0) && float64(l.Rate.Slack) > limit {
		// Case C23: the burst adds to the rate; one larger than a second's
		// worth of departures more than doubles what the downstream sees
		// in a second after an idle spell.
		v.warn(k("rate.slack"), "%d is more than the limit allows in one second (%s): after an idle spell "+
			"the downstream may see slack + 1 departures at once, on top of the rate", l.Rate.Slack, formatRate(limit))
	}
	ms := l.Rate.MinSpacing
	v.check(ms > 0 && ms <= 1, k("rate.min_spacing"), "must be in (0, 1] (intervals; 1.0 = never early), got %v", ms)
	if ms > 0 && ms < 0.5 {
		v.warn(k("rate.min_spacing"), "%v lets two departures come within half an interval of each other "+
			"while lateness is made up; a downstream that judges spacing will see that", ms)
	}
	v.check(l.Rate.Warmup.Period >= 0, k("rate.warmup.period"), "must be ≥ 0 (0s = no warmup), got %s", l.Rate.Warmup.Period)
	cf := l.Rate.Warmup.ColdFactor
	v.check(cf >= 1 && !math.IsInf(cf, 0), k("rate.warmup.cold_factor"), "must be ≥ 1 and finite, got %v", cf)
	v.adaptive(k, l.Rate)
	v.quota(k, l.Rate)
	if l.Rate.Global && !v.p.skip("redis.addr") {
		v.check(v.c.Redis.Addr != "", k("rate.global"), "true requires redis.addr (global rates are shared through Redis)")
	}
}

// laneTask checks a lane's task keys.
func (v *validator) laneTask(k func(string) string, l Lane) {
	v.check(l.Task.Timeout > 0, k("task.timeout"), "must be > 0, got %s", l.Task.Timeout)
	v.check(l.Task.MaxInFlight >= 1, k("task.max_in_flight"), "must be ≥ 1, got %d", l.Task.MaxInFlight)
	v.check(len(l.Task.Retry.Backoff) > 0, k("task.retry.backoff"), "at least one delay is required")
	for i, d := range l.Task.Retry.Backoff {
		v.check(d > 0, fmt.Sprintf("%s[%d]", k("task.retry.backoff"), i), "must be > 0, got %s", d)
	}
	v.check(l.Task.Retry.MaxDelay > 0, k("task.retry.max_delay"), "must be > 0, got %s", l.Task.Retry.MaxDelay)
	v.breaker(k, l.Task.Breaker)
}

// laneDeadLetter checks a lane's dead-letter subject (derived from a valid
// lane name when not set).
func (v *validator) laneDeadLetter(k func(string) string, nameOK bool, l Lane) {
	if nameOK {
		if why := badPublishSubject(l.DeadLetter.Subject); why != "" {
			v.check(false, k("dead_letter.subject"), "%q is not a valid subject: %s", l.DeadLetter.Subject, why)
		}
	}
}

// standby checks source.standby (SPEC §3 Standby): the replicas must share
// one NATS server for their priority group to mean anything.
func (v *validator) standby(k func(string) string, l Lane) {
	if !l.Source.Standby {
		return
	}
	if v.c.NATS.URL == "" {
		v.warn(k("source.standby"), "is true with the embedded NATS server (nats.url empty): every replica has a server of its own, so no other replica can take over")
	}
	if l.Rate.Global {
		v.warn(k("source.standby"), "is true with rate.global: only the active replica departs, so the shared Redis schedule adds a round trip per lease and nothing else (docs/scaling.md)")
	}
}

// breaker checks task.breaker (SPEC §3 Breaker); k makes a lane key path.
func (v *validator) breaker(k func(string) string, b Breaker) {
	r := b.FailureRatio
	v.check(r >= 0 && r <= 1, k("task.breaker.failure_ratio"), "must be in [0, 1] (0 = off), got %v", r)
	v.check(b.MinAttempts >= 1, k("task.breaker.min_attempts"), "must be ≥ 1, got %d", b.MinAttempts)
	v.check(b.Window > 0, k("task.breaker.window"), "must be > 0, got %s", b.Window)
	v.check(b.ProbeEvery > 0, k("task.breaker.probe_every"), "must be > 0, got %s", b.ProbeEvery)
}

func (v *validator) sink(name string, l Lane) {
	k := func(rel string) string { return "downstreams." + name + ".sink." + rel }
	s := l.Sink
	switch s.Kind {
	case SinkHTTP:
		v.httpSink(name, s)
	case SinkNATS:
		if s.Subject == "" {
			v.check(false, k("subject"), "required for sink kind nats")
		} else if why := badPublishSubject(s.Subject); why != "" {
			v.check(false, k("subject"), "%q is not a valid subject: %s", s.Subject, why)
		} else {
			for i, src := range l.Source.Subjects {
				if badSubject(src) == "" && subjectsOverlap(s.Subject, src) {
					v.check(false, k("subject"), "%q is matched by source.subjects[%d] %q of the same lane: messages would loop", s.Subject, i, src)
					break
				}
			}
		}
	case SinkLog:
	case "":
		v.check(false, k("kind"), "required: http, nats or log")
	default:
		v.check(false, k("kind"), "must be http, nats or log, got %q", s.Kind)
	}
	if s.URL != "" && (s.Kind == SinkNATS || s.Kind == SinkLog) {
		v.warn(k("url"), "ignored for sink kind %s", s.Kind)
	}
	if s.Subject != "" && (s.Kind == SinkHTTP || s.Kind == SinkLog) {
		v.warn(k("subject"), "ignored for sink kind %s", s.Kind)
	}
	v.signing(name, s)         // config/signing.go
	v.sinkAuthIgnored(name, s) // sink_auth.go
}

// httpSink reports the HTTP sink's own checks (sinks.CheckHTTP: the rules
// live in sinks, SPEC §7) with their key paths, the URL shown redacted; a
// URL with placeholders is checked against the lane's subjects
// (urltemplate.go); an explicitly empty success_status is a config error.
func (v *validator) httpSink(name string, s Sink) {
	k := func(rel string) string { return "downstreams." + name + ".sink." + rel }
	templated := s.URL != "" && hasPlaceholders(s.URL)
	if templated { // a per-message address: config/urltemplate.go
		v.urlTemplate(name, s.URL, v.c.Downstreams[name].Source.Subjects)
	}
	for _, p := range sinks.CheckHTTP(sinks.HTTPConfig{URL: s.URL, Method: s.Method, Headers: s.Headers,
		SuccessStatus: s.SuccessStatus, RetryableStatus: s.RetryableStatus}) {
		switch {
		case p.Key == "url" && templated: // reported by urlTemplate
		case p.Key == "url" && s.URL != "":
			v.check(false, k(p.Key), "%s %s", v.show(k("url"), s.URL), p.Message)
		default:
			v.check(false, k(p.Key), "%s", p.Message)
		}
	}
	if m := s.Method; m != "" && !sinks.StandardMethod(m) && !v.p.skip(k("method")) && !v.p.listed(k("method")) {
		v.warn(k("method"), "%q is not a standard HTTP method (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS): it is sent as written", m)
	}
	v.check(len(s.SuccessStatus) > 0, k("success_status"), "at least one status is required (e.g. 2xx)")
	v.sinkAuthTLS(name, s) // sink_auth.go
}

// ackWaitWarning warns when ack_wait is shorter than the worst-case time a
// message is held, capacity / rate + task.timeout, with the cold rate
// limit / cold_factor when warmup is on, and rate.adaptive.min instead of
// the limit when the adaptive rate is on (SPEC G7).
func (v *validator) ackWaitWarning(name string, l Lane) {
	k := func(rel string) string { return "downstreams." + name + "." + rel }
	rate := float64(l.Rate.Limit)
	if l.Source.AckWait <= 0 || l.Bucket.Capacity < 1 || l.Task.Timeout <= 0 ||
		!(rate > 0) || math.IsInf(rate, 0) ||
		v.p.skip(k("source.ack_wait"), k("bucket.capacity"), k("task.timeout"), k("rate.limit")) ||
		v.p.listed(k("source.ack_wait"), k("bucket.capacity"), k("task.timeout"), k("rate")) {
		// A problem in any of its inputs (rate covers the warmup and the
		// adaptive rate) leaves a default or a wrong value in its place:
		// the warning would quote it (a new-user pass).
		return
	}
	rateText := fmt.Sprintf("limit %s", formatRate(rate))
	lowest := "limit"
	if min := float64(l.Rate.Adaptive.Min); min > 0 && min < rate {
		rate, lowest = min, "rate.adaptive.min" // the adaptive rate may fall to its min
		rateText = fmt.Sprintf("rate.adaptive.min %s", formatRate(rate))
	}
	if cf := l.Rate.Warmup.ColdFactor; l.Rate.Warmup.Period > 0 && cf >= 1 && !math.IsInf(cf, 0) {
		rate /= cf
		rateText = fmt.Sprintf("cold rate %s (%s / cold_factor %v, warmup on)", formatRate(rate), lowest, cf)
	}
	// In seconds: capacity / rate can be beyond a Duration (290 years), and
	// the overflow hid the warning (3,000,000 at 1/h, a new-user pass).
	worst := float64(l.Bucket.Capacity)/rate + l.Task.Timeout.Seconds()
	if l.Source.AckWait.Seconds() >= worst {
		return
	}
	worstText := fmt.Sprintf("%.3g h", worst/3600)
	if worst < float64(math.MaxInt64/int64(time.Second)) {
		worstText = time.Duration(worst * float64(time.Second)).Round(time.Millisecond).String()
	}
	v.warn(k("source.ack_wait"),
		"%s is shorter than the worst-case wait %s (capacity %d / %s + task.timeout %s): "+
			"held messages rely on in-progress acks to avoid redelivery (SPEC G7)",
		l.Source.AckWait, worstText, l.Bucket.Capacity, rateText, l.Task.Timeout)
}

func formatRate(perSecond float64) string {
	return strconv.FormatFloat(perSecond, 'g', 4, 64) + "/s"
}
