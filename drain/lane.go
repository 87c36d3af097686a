// Package drain runs lanes: it moves messages from a Source into the lane's
// bucket, departs them at the pacer's times as tasks on a Sink under a
// per-task timeout, and settles each one with exactly one final verb — ack,
// nak for redelivery, or dead letter then term (SPEC G4). It also keeps held
// messages alive with in-progress acks (G7) and performs the graceful drain
// on shutdown (SPEC §3, Drain): a soft stop that keeps departing at the
// lane's rate, escalating to a hard stop that hands the rest back.
package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
)

// Source feeds one lane. Implementations: sources.JetStream.
//
// Contract: Fetch asks the upstream for at most max messages and calls
// deliver for each one, in upstream order, as it arrives, from the calling
// goroutine; it returns when max messages arrived or when its own request
// expires (a few seconds at most), with a non-nil error when the request
// failed. Every message received from the upstream is passed to deliver —
// none is dropped, also when ctx ends (ctx only stops the wait for more).
// Fetch is called by one goroutine at a time.
type Source interface {
	Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error
}

// Sink delivers one message to the downstream. Implementations: the sinks
// package. Send is called concurrently by up to max_in_flight tasks; it must
// return when ctx ends (the task timeout). nil means delivered. A failure
// is a *shaper.SinkError when the sink knows more (status, Retry-After);
// errors.Is(err, shaper.ErrPermanent) marks a failure no retry can fix;
// anything else is retryable.
type Sink interface {
	Send(ctx context.Context, m *shaper.Message) error
}

// WireReporter is implemented by sinks that call the function of
// shaper.WithWire when a request leaves for the downstream. For them a
// departure waits until the previous request is on the wire, so that
// requests reach the downstream in order and spaced as they departed (SPEC
// G1: the bounds hold for what reaches the downstream) — at every rate:
// above 1,000/s, task goroutines that start late would otherwise reach the
// wire in clumps (measured with the nats sink at 10,000/s: 28–54 in 1 ms
// for a bound of 11 without the hold, 12 with it). It waits for at most
// maxWireWait (or an interval, if longer), so that a request stuck in the
// client (a dial that hangs) does not hold the lane for long (G5). Only the
// write of a request can hold the next departure, never the wait for its
// response. The cost is rate when the write path is slower than an
// interval: then the wire, not the pacer, sets the pace.
type WireReporter interface {
	ReportsWire() bool
}

// maxWireWait bounds how long a departure waits for the previous request to
// reach the wire (WireReporter). The first request on a new connection pays
// the dial (measured up to ~15 ms on loopback here).
const maxWireWait = 50 * time.Millisecond

// Dead-letter header names (SPEC §3, Dead letter).
const (
	HeaderReason     = "Shaper-Reason"
	HeaderDownstream = "Shaper-Downstream"
	HeaderAttempts   = "Shaper-Attempts"
	HeaderLastError  = "Shaper-Last-Error"
	HeaderLastStatus = "Shaper-Last-Status"
	HeaderStream     = "Shaper-Stream"
	HeaderStreamSeq  = "Shaper-Stream-Seq"
	// HeaderKey carries the message's idempotency key (SPEC G8) on a dead
	// letter, whose own Nats-Msg-Id is "<lane>/<key>": the dead-letter
	// stream de-duplicates by Nats-Msg-Id, and two lanes may dead-letter
	// messages with the same key.
	HeaderKey = "Shaper-Key"
)

// drainNakDelay is the delay of the naks that hand back a drain's leftovers.
// A delayed nak is written to the consumer's store, unlike a plain nak, so
// the handback survives a restart of the embedded server (NOTES.md; the
// server's processNak stores the new pending timestamp only with a delay).
const drainNakDelay = time.Millisecond

// ackTimeout bounds the wait for an ack, nak or dead-letter publish.
const ackTimeout = 5 * time.Second

// Option configures a Lane.
type Option interface{ apply(*Lane) }

type optionFunc func(*Lane)

func (f optionFunc) apply(l *Lane) { f(l) }

// WithLogger sets the logger (default: discard).
func WithLogger(log *slog.Logger) Option {
	return optionFunc(func(l *Lane) { l.log = log })
}

// WithMetrics sets the lane's metric series (default: a private registry).
func WithMetrics(m *metrics.Lane) Option {
	return optionFunc(func(l *Lane) { l.m = m })
}

// WithWaiter sets how the departure loop sleeps (default
// shaper.NewPreciseWaiter(); use shaper.TimerWaiter{} under synctest).
func WithWaiter(w shaper.Waiter) Option {
	return optionFunc(func(l *Lane) { l.waiter = w })
}

// WithDeadLetter sets where dead letters are published, with a publish ack
// (default: none, and a message that must be dead-lettered is nak'd instead,
// so nothing is lost).
func WithDeadLetter(s Sink) Option {
	return optionFunc(func(l *Lane) { l.dead = s })
}

// Lane runs one downstream. Create it with New, start it with Start, stop it
// with Drain. Its methods are safe for concurrent use.
type Lane struct {
	name   string
	cfgp   atomic.Pointer[config.Lane] // replaced by Update (hot reload)
	src    Source
	sinkp  atomic.Pointer[sinkBox] // replaced by SetSink (hot reload)
	dead   Sink
	log    *slog.Logger
	m      *metrics.Lane
	waiter shaper.Waiter

	bucket *shaper.Bucket
	slots  *semaphore // max_in_flight

	mu       sync.Mutex
	pacer    *shaper.Pacer
	inflight map[*shaper.Message]struct{}
	// unwired is the last departed message while its request is not yet on
	// the wire (sinks that report it, see WireReporter), departedAt its
	// departure time.
	unwired     *shaper.Message
	departedAt  time.Time
	reportsWire bool
	wake        chan struct{} // pacer changed (pause)
	// lastDeparture is the time of the previous departure (gap metric);
	// only the departure loop touches it.
	lastDeparture time.Time
	global        *globalState // rate.global (WithGlobal); nil = local only

	fetchStop  chan struct{} // closed: stop fetching
	fetchDone  chan struct{} // closed when the fetch loop returned
	departStop chan struct{} // closed: the departure loop must return now
	departDone chan struct{}
	houseStop  chan struct{}
	houseDone  chan struct{}
	tasks      sync.WaitGroup
	started    atomic.Bool
	draining   atomic.Bool

	delivered, nacked, deadLettered atomic.Int64
	failures                        atomic.Int64 // failed attempts since the last warning
	failureLogAt                    atomic.Int64 // unix ns of the last warning
}

// New returns a lane named name for cfg, reading from src and delivering to
// sink. cfg must have passed config.Validate.
func New(name string, cfg config.Lane, src Source, sink Sink, opts ...Option) (*Lane, error) {
	if src == nil || sink == nil {
		return nil, fmt.Errorf("lane %q: source and sink are required", name)
	}
	l := &Lane{
		name: name, src: src,
		log:        slog.New(slog.DiscardHandler),
		bucket:     shaper.NewBucket(cfg.Bucket.Capacity),
		slots:      newSemaphore(cfg.Task.MaxInFlight),
		inflight:   map[*shaper.Message]struct{}{},
		wake:       make(chan struct{}, 1),
		fetchStop:  make(chan struct{}),
		fetchDone:  make(chan struct{}),
		departStop: make(chan struct{}),
		departDone: make(chan struct{}),
		houseStop:  make(chan struct{}),
		houseDone:  make(chan struct{}),
	}
	l.cfgp.Store(&cfg)
	l.sinkp.Store(&sinkBox{sink})
	for _, o := range opts {
		o.apply(l)
	}
	if l.m == nil {
		l.m = metrics.Discard(name, float64(cfg.Rate.Limit))
	}
	if l.waiter == nil {
		l.waiter = shaper.NewPreciseWaiter()
	}
	l.log = l.log.With("lane", name)
	if wr, ok := sink.(WireReporter); ok && wr.ReportsWire() {
		l.reportsWire = true // a replacement sink is of the same kind (Update)
	}
	l.pacer = shaper.NewPacer(pacerConfig(cfg), time.Now())
	l.m.BucketCapacity.Set(float64(l.bucket.Capacity()))
	l.m.RateLimit.Set(l.pacer.Rate(time.Now()))
	return l, nil
}

func pacerConfig(cfg config.Lane) shaper.PacerConfig {
	return shaper.PacerConfig{
		Limit:        cfg.Rate.Limit,
		Slack:        cfg.Rate.Slack,
		MinSpacing:   cfg.Rate.MinSpacing,
		WarmupPeriod: cfg.Rate.Warmup.Period,
		ColdFactor:   cfg.Rate.Warmup.ColdFactor,
	}
}

// sinkBox lets the sink be swapped atomically whatever its concrete type.
type sinkBox struct{ s Sink }

// conf returns the lane's configuration in force (see Update).
func (l *Lane) conf() *config.Lane { return l.cfgp.Load() }

// ErrRestartNeeded is returned by Update when the change touches the lane's
// source or overflow mode, which cannot change in place: the caller drains
// the lane and starts a new one.
var ErrRestartNeeded = errors.New("drain: this change needs a lane restart")

// Update applies a new configuration in place (hot reload): rate, slack,
// warmup, capacity, max_in_flight, timeouts, retries, max_wait, max_age,
// dead-letter-free settings. Messages held stay where they are; nothing is
// nak'd or redelivered. A smaller capacity only limits new admissions. It
// returns ErrRestartNeeded, changing nothing, when the source (stream,
// subjects, consumer, ack_wait, max_ack_pending), the overflow mode or the
// dead-letter subject changed. The sink is swapped separately (SetSink).
func (l *Lane) Update(cfg config.Lane) error {
	old := l.conf()
	if !sameSource(old.Source, cfg.Source) || old.Bucket.Overflow != cfg.Bucket.Overflow ||
		old.DeadLetter != cfg.DeadLetter || old.Rate.Global != cfg.Rate.Global {
		return ErrRestartNeeded
	}
	l.cfgp.Store(&cfg)
	now := time.Now()
	pc := pacerConfig(cfg)
	if l.global != nil && l.global.reducedNow.Load() {
		pc.Limit /= shaper.Limit(l.global.hint) // in fallback: stay at limit / replicas_hint
	}
	l.mu.Lock()
	l.pacer.SetConfig(pc, now) // keeps the schedule and the credit (SPEC G2)
	l.mu.Unlock()
	l.bucket.SetCapacity(cfg.Bucket.Capacity)
	l.slots.setLimit(cfg.Task.MaxInFlight)
	l.m.BucketCapacity.Set(float64(cfg.Bucket.Capacity))
	select {
	case l.wake <- struct{}{}:
	default:
	}
	l.log.Info("lane reconfigured", "limit", cfg.Rate.Limit.String(), "capacity", cfg.Bucket.Capacity,
		"max_in_flight", cfg.Task.MaxInFlight)
	return nil
}

func sameSource(a, b config.Source) bool {
	if a.Stream != b.Stream || a.Consumer != b.Consumer || a.AckWait != b.AckWait ||
		a.MaxAckPending != b.MaxAckPending || len(a.Subjects) != len(b.Subjects) {
		return false
	}
	for i := range a.Subjects {
		if a.Subjects[i] != b.Subjects[i] {
			return false
		}
	}
	return true
}

// SetSink replaces the sink for the tasks that depart from now on and
// returns the previous one, which the caller closes (its Close waits for the
// calls still running).
func (l *Lane) SetSink(s Sink) Sink {
	old := l.sinkp.Swap(&sinkBox{s})
	l.log.Info("lane sink replaced")
	return old.s
}

// Name returns the lane's name.
func (l *Lane) Name() string { return l.name }

// Start starts the fetch loop, the departure loop and the housekeeping loop
// (gauges and in-progress acks). It returns at once; call Drain to stop.
func (l *Lane) Start() {
	if !l.started.CompareAndSwap(false, true) {
		return
	}
	l.mu.Lock()
	l.pacer = shaper.NewPacer(pacerConfig(*l.conf()), time.Now()) // cold at start
	l.mu.Unlock()
	go l.fetchLoop()
	go l.departLoop()
	go l.houseLoop()
	l.log.Info("lane started", "limit", l.conf().Rate.Limit.String(), "capacity", l.conf().Bucket.Capacity,
		"max_in_flight", l.conf().Task.MaxInFlight, "overflow", l.conf().Bucket.Overflow)
}

// Summary counts what happened to messages during a drain.
type Summary struct {
	Delivered    int64 // acked after the sink reported success
	Nacked       int64 // handed back for redelivery (retries and leftovers)
	DeadLettered int64
	Leftovers    int // of Nacked: messages still in the bucket at the end
}

// Drain stops the lane gracefully (SPEC §3): it stops fetching, keeps
// departing at the lane's rate until the bucket is empty or ctx ends (the
// drain timeout, or a second signal), hands what is left back with a nak,
// waits for running tasks to finish or time out, and returns what happened
// meanwhile. It does not close the source's connection; the caller flushes
// and closes it afterwards so that the acks reach the server.
func (l *Lane) Drain(ctx context.Context) Summary {
	d0, n0, x0 := l.delivered.Load(), l.nacked.Load(), l.deadLettered.Load()
	if !l.started.Load() {
		return Summary{}
	}
	if !l.draining.CompareAndSwap(false, true) {
		return Summary{}
	}
	l.log.Info("lane draining", "bucket_depth", l.bucket.Len())
	close(l.fetchStop)
	// The pull in progress can take up to sources.FetchExpiry to end; the
	// end of ctx (drain timeout, second signal) stops departures meanwhile,
	// not after it (found by TestChaosDoubleSIGTERMFastPath: ~70 departures
	// after the second signal).
	select {
	case <-l.fetchDone:
		select {
		case <-l.departDone: // the bucket ran empty
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
	close(l.departStop)
	<-l.departDone
	<-l.fetchDone // what the last pull brought is in the bucket: handed back below
	left := 0
	for {
		m, _ := l.bucket.Pop()
		if m == nil {
			break
		}
		left++
		l.nak(m, drainNakDelay, shaper.RetryDrain)
	}
	l.m.BucketDepth.Set(0)
	l.tasks.Wait()
	close(l.houseStop)
	<-l.houseDone
	s := Summary{
		Delivered:    l.delivered.Load() - d0,
		Nacked:       l.nacked.Load() - n0,
		DeadLettered: l.deadLettered.Load() - x0,
		Leftovers:    left,
	}
	l.log.Info("lane drained", "delivered", s.Delivered, "nacked", s.Nacked,
		"dead_lettered", s.DeadLettered, "leftovers", left)
	return s
}

// fetchLoop fills the bucket from the source. In overflow mode "block" it
// fetches only into free slots (G6); in "reject" it keeps fetching and the
// bucket refuses what does not fit.
func (l *Lane) fetchLoop() {
	defer close(l.fetchDone)
	reject := l.conf().Bucket.Overflow == "reject"
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-l.fetchStop:
			return
		default:
		}
		capacity := l.bucket.Capacity()
		want := 0
		switch {
		case reject:
			want = min(capacity, 256)
		case l.bucket.Len() == 0 || l.bucket.Free() >= fetchLowWater(capacity):
			// Block mode: one pull per batch of freed slots, not one per
			// departure (a pull request costs an inbox, a subscription and
			// a JSON request); an empty bucket always asks at once.
			want = l.bucket.Reserve(capacity)
		}
		if want == 0 {
			select {
			case <-l.fetchStop:
				return
			case <-l.bucket.Freed():
			}
			continue
		}
		got := 0
		err := l.src.Fetch(context.Background(), want, func(m *shaper.Message) {
			got++
			l.admit(m, !reject)
		})
		if !reject {
			l.bucket.Release(want - got)
		}
		if err != nil {
			l.log.Warn("fetch failed", "err", err, "retry_in", backoff)
			select {
			case <-l.fetchStop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// fetchLowWater is how many slots must be free before a lane whose bucket
// still holds messages pulls again: a quarter of the capacity, at most 64.
// The messages still waiting cover the pull's round trip.
func fetchLowWater(capacity int) int { return max(1, min(capacity/4, 64)) }

// admit puts m into the bucket, or dead-letters it when it does not fit.
func (l *Lane) admit(m *shaper.Message, reserved bool) {
	if m.NumDelivered > 1 {
		l.m.Redelivered.Inc()
	}
	if m.Invalid == "" && l.conf().Source.MaxMessageBytes > 0 && len(m.Data) > l.conf().Source.MaxMessageBytes {
		m.Invalid = fmt.Sprintf("payload of %d bytes exceeds source.max_message_bytes %d", len(m.Data), l.conf().Source.MaxMessageBytes)
	}
	if m.Invalid != "" {
		if reserved {
			l.bucket.Release(1)
		}
		l.tasks.Add(1)
		go func() {
			defer l.tasks.Done()
			l.deadLetter(m, shaper.ReasonInvalid, errors.New(m.Invalid), notAttempted)
		}()
		return
	}
	now := time.Now()
	// Projected wait (reject mode): until the pacer's next departure (a
	// pause included), then what is ahead at the ramp's rate.
	l.mu.Lock()
	rate := l.pacer.RampRate(now)
	maxWait := l.conf().Bucket.MaxWait
	if first := l.pacer.Next(now).Sub(now); maxWait > 0 && first > 0 {
		maxWait -= first
		if maxWait <= 0 {
			maxWait = 1 // any wait exceeds it
			rate = 0
		}
	}
	l.mu.Unlock()
	wasEmpty, err := l.bucket.Admit(m, now, reserved, rate, maxWait)
	if err != nil {
		reason := shaper.ReasonOverflow
		if errors.Is(err, shaper.ErrMaxWait) {
			reason = shaper.ReasonMaxWait
		}
		l.tasks.Add(1)
		go func() {
			defer l.tasks.Done()
			l.deadLetter(m, reason, err, notAttempted)
		}()
		return
	}
	l.m.Admitted.Inc()
	l.m.BucketDepth.Set(float64(l.bucket.Len()))
	if wasEmpty {
		l.mu.Lock()
		l.pacer.SetBusy(now, true)
		l.mu.Unlock()
	}
}

// departLoop releases messages from the bucket at the pacer's times.
func (l *Lane) departLoop() {
	defer close(l.departDone)
	l.waiter.Bind()
	defer l.waiter.Unbind()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.departStop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		// 1. A message at the head (expired ones go to the dead letter
		// without taking a departure).
		if !l.awaitHead(ctx) {
			return
		}
		// 2. A free task slot (G5: at most max_in_flight at once).
		if !l.slots.acquire(ctx) {
			return
		}
		// While the source is disconnected, hold departures: a delivery's
		// ack could not reach the server, and the message would likely be
		// delivered again after the reconnect.
		if !l.awaitConnected(ctx) {
			l.slots.release()
			return
		}
		ready := time.Now()
		now := ready
		scheduled := now // the instant the departure was due (lateness metric)
		// 3. The pacer's time. A pause (Retry-After) wakes the wait.
		for {
			l.mu.Lock()
			at := l.pacer.Next(now)
			if l.unwired != nil {
				if rate := l.pacer.Rate(now); rate > 0 {
					bound := max(maxWireWait, shaper.Limit(rate).Interval())
					if w := l.departedAt.Add(bound); w.After(at) {
						at = w
					}
				}
			}
			l.mu.Unlock()
			if !at.After(now) && l.global != nil {
				var ok bool // the shared schedule's slot (global.go)
				if at, ok = l.globalAt(ctx, now); !ok {
					l.slots.release()
					return
				}
			}
			if !at.After(now) {
				break
			}
			scheduled = at
			if _, err := l.waiter.Wait(ctx, at, l.wake); err != nil {
				l.slots.release()
				return
			}
			now = time.Now()
		}
		// 4. Departure, of the first message that has not expired at this
		// instant (SPEC §3 Max age: after every wait; an expired message
		// takes no departure slot, the next one leaves in its place).
		m, empty := l.popDeliverable(now)
		if m == nil { // all expired (or, cannot happen, popped by another)
			l.slots.release()
			continue
		}
		l.mu.Lock()
		prev := l.lastDeparture
		l.lastDeparture = now
		l.pacer.Depart(ready, now)
		if empty {
			l.pacer.SetBusy(now, false)
		}
		m.Departed = now
		l.inflight[m] = struct{}{}
		if l.reportsWire {
			l.unwired, l.departedAt = m, now
		}
		l.mu.Unlock()
		if l.global != nil {
			l.global.held = time.Time{} // the slot is used
		}
		l.m.Departures.Inc()
		l.m.Lateness.Observe(max(0, now.Sub(scheduled)).Seconds())
		if !prev.IsZero() {
			l.m.Gap.Observe(now.Sub(prev).Seconds())
		}
		l.m.QueueWait.Observe(now.Sub(m.Admitted).Seconds())
		l.m.BucketDepth.Set(float64(l.bucket.Len()))
		l.m.InFlight.Inc()
		l.tasks.Add(1)
		go l.runTask(m)
	}
}

// Connector is implemented by sources that can tell whether they are
// connected to their server (sources.JetStream).
type Connector interface{ Connected() bool }

// awaitConnected waits while the source reports it is disconnected; false
// when ctx ended first.
func (l *Lane) awaitConnected(ctx context.Context) bool {
	c, ok := l.src.(Connector)
	if !ok || c.Connected() {
		return true
	}
	l.log.Warn("source disconnected: departures held until it reconnects")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !c.Connected() {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	l.log.Info("source reconnected: departures resume")
	return true
}

// awaitHead waits until the bucket has a deliverable message at its head,
// dead-lettering expired ones (bucket.max_age). It returns false when the
// loop must end: stopped, or draining with the bucket empty and fetching over.
func (l *Lane) awaitHead(ctx context.Context) bool {
	for {
		if l.bucket.Peek() != nil {
			// Expired messages at the head need no slot and no wait.
			if l.sweepExpired(time.Now(), true) {
				continue
			}
			return true
		}
		select {
		case <-l.fetchDone: // closes only when a drain stopped fetching
			if l.bucket.Len() == 0 {
				return false
			}
			continue
		default:
		}
		select {
		case <-l.bucket.NonEmpty():
		case <-l.fetchDone:
		case <-ctx.Done():
			return false
		}
	}
}

// popDeliverable pops the head for a departure at now, dead-lettering the
// messages that expired (bucket.max_age) on the way; nil when none is left.
func (l *Lane) popDeliverable(now time.Time) (*shaper.Message, bool) {
	maxAge := l.conf().Bucket.MaxAge
	for {
		m, empty := l.bucket.Pop()
		if m == nil || !shaper.Expired(m, now, maxAge) {
			return m, empty
		}
		if empty {
			l.mu.Lock()
			l.pacer.SetBusy(now, false)
			l.mu.Unlock()
		}
		l.expire(m, maxAge)
		if empty {
			return nil, true
		}
	}
}

// sweepExpired dead-letters the messages of the bucket that are older than
// bucket.max_age at now: only at the head when headOnly (the departure
// loop, cheap), else anywhere (housekeeping, so that a paused or blocked
// lane dead-letters messages as they pass max_age). It reports whether any
// was removed.
func (l *Lane) sweepExpired(now time.Time, headOnly bool) bool {
	maxAge := l.conf().Bucket.MaxAge
	if maxAge <= 0 {
		return false
	}
	stop := false
	removed, empty := l.bucket.RemoveIf(func(m *shaper.Message) bool {
		if stop {
			return false
		}
		if !shaper.Expired(m, now, maxAge) {
			stop = headOnly
			return false
		}
		return true
	})
	if len(removed) == 0 {
		return false
	}
	if empty {
		l.mu.Lock()
		l.pacer.SetBusy(now, false)
		l.mu.Unlock()
	}
	l.m.BucketDepth.Set(float64(l.bucket.Len()))
	for _, m := range removed {
		l.expire(m, maxAge)
	}
	return true
}

// expire dead-letters m, which is older than maxAge, with reason expired.
func (l *Lane) expire(m *shaper.Message, maxAge time.Duration) {
	l.tasks.Add(1)
	go func() {
		defer l.tasks.Done()
		l.deadLetter(m, shaper.ReasonExpired, fmt.Errorf("older than bucket.max_age %s at departure", maxAge), notAttempted)
	}()
}

// runTask makes one delivery attempt under the task timeout and settles it.
func (l *Lane) runTask(m *shaper.Message) {
	defer func() {
		l.mu.Lock()
		delete(l.inflight, m)
		if l.unwired == m {
			l.unwired = nil
		}
		l.mu.Unlock()
		l.m.InFlight.Dec()
		l.slots.release()
		l.tasks.Done()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), l.conf().Task.Timeout)
	ctx = shaper.WithWire(ctx, func(t time.Time) { l.wired(m, t) })
	start := time.Now()
	err := l.sinkp.Load().s.Send(ctx, m)
	took := time.Since(start)
	timedOut := err != nil && (errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil)
	cancel()
	switch {
	case err == nil:
		l.m.TaskDuration[shaper.OutcomeSuccess].Observe(took.Seconds())
	case timedOut:
		l.m.TaskDuration[shaper.OutcomeTimeout].Observe(took.Seconds())
	default:
		l.m.TaskDuration[shaper.OutcomeError].Observe(took.Seconds())
	}
	l.settle(m, err, timedOut)
}

// settle gives m its final verb for this attempt (SPEC §3, Retries).
func (l *Lane) settle(m *shaper.Message, err error, timedOut bool) {
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		aerr := m.Acker.Ack(ctx)
		cancel()
		if aerr != nil {
			// The downstream has it; the server will redeliver after ack
			// wait and the idempotency key (G8) lets the downstream dedupe.
			l.log.Warn("ack failed", "msg_id", m.Key(), "err", aerr)
		}
		l.delivered.Add(1)
		l.m.Deliveries[shaper.OutcomeSuccess].Inc()
		return
	}
	cfg := l.conf()
	v := decide(err, timedOut, m.NumDelivered, cfg.Source, cfg.Task.Retry)
	if v.kind == verdictDeadLetter {
		if l.deadLetter(m, v.reason, err, v.status) {
			l.m.Deliveries[shaper.OutcomeDeadLetter].Inc()
		} else {
			l.m.Deliveries[shaper.OutcomeRetry].Inc()
		}
		return
	}
	if v.pause {
		// The downstream is saturated: pause the whole lane (SPEC §3).
		l.Pause(time.Now().Add(v.delay))
	}
	l.log.Debug("attempt failed", "msg_id", m.Key(), "attempt", m.NumDelivered, "status", v.status, "err", err, "retry_in", v.delay)
	l.warnFailures(m, v.status, err, v.delay)
	l.m.Deliveries[shaper.OutcomeRetry].Inc()
	l.nak(m, v.delay, v.reason)
}

// failureLogEvery bounds the warnings about failing attempts: one line per
// lane per period, with how many failed since the last one.
const failureLogEvery = 10 * time.Second

// warnFailures logs failing attempts at warn level, at most once per
// failureLogEvery, so that an operator sees a hanging or failing downstream in
// the logs without one line per message.
func (l *Lane) warnFailures(m *shaper.Message, status int, err error, delay time.Duration) {
	n := l.failures.Add(1)
	now := time.Now().UnixNano()
	last := l.failureLogAt.Load()
	if now-last < int64(failureLogEvery) || !l.failureLogAt.CompareAndSwap(last, now) {
		return
	}
	l.failures.Add(-n)
	l.log.Warn("delivery attempts failing; messages are retried", "failed_attempts", n,
		"last_status", status, "last_err", err, "msg_id", m.Key(), "retry_in", delay)
}

// wired moves the pacer's spacing anchor to when m's request really left
// (shaper.WithWire) and wakes the departure loop to re-read its time.
func (l *Lane) wired(m *shaper.Message, t time.Time) {
	l.mu.Lock()
	moved := l.pacer.Wire(m.Departed, t)
	if l.unwired == m {
		l.unwired = nil
		moved = true
	}
	l.mu.Unlock()
	if moved {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// Pause holds the lane's departures until until (a downstream's Retry-After).
// A global lane also extends the shared pause, so that every replica
// pauses (best effort: when the shared store fails, only this one does).
func (l *Lane) Pause(until time.Time) {
	l.mu.Lock()
	extended := until.After(l.pacer.PausedUntil())
	l.pacer.Pause(until)
	l.mu.Unlock()
	if extended {
		l.log.Info("lane paused by downstream", "until", until.Format(time.RFC3339Nano))
		l.m.Paused.Set(1)
		l.m.RateLimit.Set(0)
		select {
		case l.wake <- struct{}{}:
		default:
		}
		if l.global != nil {
			l.pauseGlobal(until) // every replica of the lane pauses
		}
	}
}

func (l *Lane) nak(m *shaper.Message, delay time.Duration, reason string) {
	if err := m.Acker.Nak(delay); err != nil {
		l.log.Warn("nak failed", "msg_id", m.Key(), "err", err)
	}
	l.nacked.Add(1)
	l.m.Retries[reason].Inc()
}

// notAttempted is the status passed to deadLetter for a message dead-lettered
// before this delivery reached the sink (overflow, max_wait, expired,
// invalid): its Shaper-Attempts counts only the earlier deliveries' attempts
// and it has no Shaper-Last-Status.
const notAttempted = -1

// deadLetter publishes m with its reason to the dead-letter subject and, once
// the server acknowledged that publish, terminates the original (SPEC §3,
// G4). When the publish fails the original is nak'd instead: nothing is lost.
// It reports whether the message was dead-lettered.
func (l *Lane) deadLetter(m *shaper.Message, reason string, cause error, status int) bool {
	if l.dead == nil {
		l.log.Error("no dead-letter publisher; message handed back", "msg_id", m.Key(), "reason", reason)
		l.nak(m, backoff(l.conf().Task.Retry.Backoff, m.NumDelivered), shaper.OutcomeError)
		return false
	}
	h := make(map[string][]string, len(m.Header)+7)
	for k, v := range m.Header {
		h[k] = v
	}
	h[HeaderReason] = []string{reason}
	h[HeaderDownstream] = []string{l.name}
	attempts := m.NumDelivered
	if status == notAttempted && attempts > 0 {
		attempts-- // this delivery never reached the sink
	}
	h[HeaderAttempts] = []string{strconv.FormatUint(attempts, 10)}
	if cause != nil {
		h[HeaderLastError] = []string{truncate(cause.Error(), 512)}
	}
	if status != notAttempted {
		h[HeaderLastStatus] = []string{strconv.Itoa(status)}
	}
	h[HeaderStream] = []string{m.Stream}
	h[HeaderStreamSeq] = []string{strconv.FormatUint(m.StreamSeq, 10)}
	h[HeaderKey] = []string{m.Key()}
	h[shaper.MsgIDHeader] = []string{l.name + "/" + m.Key()}
	dm := *m
	dm.Header = h
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	err := l.dead.Send(ctx, &dm)
	cancel()
	if err != nil {
		l.log.Error("dead-letter publish failed; message handed back", "msg_id", m.Key(), "reason", reason, "err", err)
		l.nak(m, backoff(l.conf().Task.Retry.Backoff, m.NumDelivered), shaper.OutcomeError)
		return false
	}
	if err := m.Acker.Term(reason); err != nil {
		l.log.Warn("term failed after dead letter", "msg_id", m.Key(), "err", err)
	}
	l.deadLettered.Add(1)
	l.m.DeadLetters[reason].Inc()
	l.log.Info("dead-lettered", "msg_id", m.Key(), "reason", reason, "attempt", m.NumDelivered)
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// houseLoop refreshes gauges and sends in-progress acks for every message the
// lane holds, before the server's ack wait runs out (SPEC G7).
func (l *Lane) houseLoop() {
	defer close(l.houseDone)
	ackWait := l.conf().Source.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	progressEvery := max(ackWait/4, 50*time.Millisecond)
	gauge := time.NewTicker(250 * time.Millisecond)
	defer gauge.Stop()
	progress := time.NewTicker(progressEvery)
	defer progress.Stop()
	for {
		select {
		case <-l.houseStop:
			return
		case now := <-gauge.C:
			now = time.Now()
			l.mu.Lock()
			rate := l.pacer.Rate(now)
			paused := now.Before(l.pacer.PausedUntil())
			l.mu.Unlock()
			l.m.RateLimit.Set(rate)
			if paused {
				l.m.Paused.Set(1)
			} else {
				l.m.Paused.Set(0)
			}
			l.m.BucketDepth.Set(float64(l.bucket.Len()))
			l.sweepExpired(now, false)
		case <-progress.C:
			l.touch(time.Now(), ackWait/2)
		}
	}
}

// touch sends InProgress for each held message last touched more than
// threshold ago.
func (l *Lane) touch(now time.Time, threshold time.Duration) {
	var due []*shaper.Message
	pick := func(m *shaper.Message) {
		last := m.Received
		if m.Touched.After(last) {
			last = m.Touched
		}
		if now.Sub(last) >= threshold {
			m.Touched = now
			due = append(due, m)
		}
	}
	l.bucket.Each(pick)
	l.mu.Lock()
	for m := range l.inflight {
		pick(m)
	}
	l.mu.Unlock()
	for _, m := range due {
		if err := m.Acker.InProgress(); err != nil {
			l.log.Debug("in-progress ack failed", "msg_id", m.Key(), "err", err)
		}
	}
}
