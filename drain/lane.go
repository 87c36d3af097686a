// Package drain is the worker: it runs lanes. It moves messages from a
// Source into the lane's bucket (fetch.go), departs them at the pacer's times
// (depart.go) as tasks on a Sink under a per-task timeout (task.go), and
// settles each one with exactly one final verb — ack, nak for redelivery, or
// dead letter then term (SPEC G4; the verdict is decide in verdict.go, the
// dead letter in deadletter.go). It keeps held messages alive with
// in-progress acks (G7, keepalive.go), shares a rate across replicas
// (global.go), and performs the graceful drain of SPEC §3 on shutdown (the
// package's name; lane.go): a soft stop that keeps departing at the lane's
// rate, escalating to a hard stop that hands the rest back. Its contracts
// with sources and sinks are in contracts.go.
package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
)

// drainNakDelay is the delay of the naks that hand back a drain's leftovers.
// A delayed nak is written to the consumer's store, unlike a plain nak, so
// the handback survives a restart of the embedded server (NOTES.md; the
// server's processNak stores the new pending timestamp only with a delay).
const drainNakDelay = time.Millisecond

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
// NewPreciseWaiter(); use TimerWaiter{} under synctest). With a
// PreciseWaiter (Linux) the loop runs short tasks itself (follower.go); a
// wrapper around one keeps that when it has a method Unwrap() Waiter that
// returns it.
func WithWaiter(w Waiter) Option {
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
	waiter Waiter

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
	// gatesWire: the sink holds each request's write until its departure
	// instant (WireGater), the lane's waiter is on the real clock and the
	// lane is not on the shared schedule: the departure loop may release
	// tasks a lead early (gate.go).
	gatesWire bool
	gate      writeGate     // the departure instants' gate (gate.go)
	ot        overtakes     // requests overtaken before their write (gate.go)
	wake      chan struct{} // pacer changed (pause)
	// lastDeparture is the time of the previous departure (gap metric);
	// only the departure loop touches it.
	lastDeparture time.Time
	global        *globalState              // rate.global (WithGlobal); nil = local only
	hold          *Hold                     // an operator's pause (control.go); nil = none
	purgeMark     atomic.Pointer[PurgeMark] // an operator's purge (control.go); nil = none
	purgeQ        []*shaper.Message         // purged, waiting for their dead letter in order
	purging       bool                      // a goroutine works through purgeQ
	pauseLogged   time.Time                 // the end of the last pause whose end was logged
	brk           laneBreaker               // task.breaker (breaker.go)
	deadlines     atomic.Bool               // a message with a Shaper-Deadline was admitted (timing.go)
	dedup         laneDedup                 // sink.dedup_window (dedup.go)
	adapt         laneAdaptive              // rate.adaptive (adaptive.go)
	quota         laneQuota                 // rate.quota (quota.go)
	standby       laneStandby               // source.standby (standby.go)

	burst      fetchBurst    // a pull's messages expected or arriving (burst.go)
	burstSpin  bool          // the departure loop spins its short waits during a burst (burst.go)
	fetchStop  chan struct{} // closed: stop fetching
	fetchDone  chan struct{} // closed when the fetch loop returned
	departStop chan struct{} // closed: the departure loop must return now
	departDone chan struct{}
	houseStop  chan struct{}
	houseDone  chan struct{}
	houseNudge chan struct{} // an admission while houseSlow (keepalive.go)
	houseSlow  atomic.Bool   // the house loop's period is stretched (keepalive.go)
	tasks      sync.WaitGroup
	started    atomic.Bool
	draining   atomic.Bool
	stopped    atomic.Bool
	lastErr    atomic.Value // string: the last failed attempt's error
	recent     recentStats  // achieved rate and queue waits (Status)

	delivered, nacked, deadLettered atomic.Int64
	failures                        atomic.Int64 // failed attempts since the last warning
	failureLogAt                    atomic.Int64 // unix ns of the last warning

	dlLog   deadLetterLog // rate limit of the dead-letter lines (deadletter_log.go)
	acks    ackBatch      // acks of successful deliveries, sent together (ackbatch.go)
	workers workers       // the goroutines that run tasks (workers.go)
	relay   relay         // the departure loop's pair of goroutines (follower.go)

	mem        *MemoryBudget // the process's soft memory limit (memory.go); nil: none
	maxPayload atomic.Int64  // the largest payload fetched, bytes (memory.go)
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
		bucket:     shaper.NewFairBucket(cfg.Bucket.Capacity, fairKey(cfg)),
		slots:      newSemaphore(cfg.Task.MaxInFlight),
		inflight:   map[*shaper.Message]struct{}{},
		wake:       make(chan struct{}, 1),
		ot:         overtakes{wake: make(chan struct{}, 1), taskEnded: make(chan struct{}, 1)},
		fetchStop:  make(chan struct{}),
		fetchDone:  make(chan struct{}),
		departStop: make(chan struct{}),
		departDone: make(chan struct{}),
		houseStop:  make(chan struct{}),
		houseDone:  make(chan struct{}),
		houseNudge: make(chan struct{}, 1),
	}
	l.acks.send = l.sendAck
	l.cfgp.Store(&cfg)
	l.bucket.SetFreedThreshold(fetchLowWater(cfg.Bucket.Capacity)) // fetch.go
	l.sinkp.Store(newSinkBox(sink))
	for _, o := range opts {
		o.apply(l)
	}
	if l.m == nil {
		l.m = metrics.Discard(name, float64(cfg.Rate.Limit))
	}
	if l.waiter == nil {
		l.waiter = NewPreciseWaiter()
	}
	l.burstSpin = spinsOnTheClock(l.waiter) // burst.go
	l.log = l.log.With("lane", name)
	if wr, ok := sink.(WireReporter); ok && wr.ReportsWire() {
		l.reportsWire = true // a replacement sink is of the same kind (Update)
		_, onClock := realClock(l.waiter)
		g, gates := sink.(WireGater)
		l.gatesWire = onClock && gates && g.GatesWire() && l.global == nil // a global slot is used when it leaves
	}
	l.setAdaptive(cfg)
	l.pacer = shaper.NewPacer(l.pacerConfigNow(cfg, time.Now()), time.Now())
	l.setQuota(cfg, time.Now())
	l.brk.b = shaper.NewBreaker(breakerConfig(cfg), time.Now())
	l.m.BucketCapacity.Set(float64(l.bucket.Capacity()))
	l.m.RateLimit.Set(l.pacer.Rate(time.Now()))
	if l.global != nil {
		if dn, ok := l.global.g.(DropNotifier); ok { // it drops slots of its own (global.go)
			dropped := l.m.SlotsDropped
			dn.OnDrop(func(n int) { dropped.Add(float64(n)) })
		}
	}
	l.mem.join(l) // memory.go
	return l, nil
}

// fairKey is the key function of bucket.fair_key (nil: one FIFO); the
// value was validated.
func fairKey(cfg config.Lane) func(*shaper.Message) string {
	f, _ := shaper.FairKeyFunc(cfg.Bucket.FairKey)
	return f
}

// pacerConfigNow is pacerConfig with the adaptive rate in force at now as
// the limit (adaptive.go). Call with l.mu held, or before the lane starts.
func (l *Lane) pacerConfigNow(cfg config.Lane, now time.Time) shaper.PacerConfig {
	pc := pacerConfig(cfg)
	pc.Limit = l.limitNow(cfg, now)
	return pc
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
// packed says the sink reads packed headers (PackedHeaderReader).
type sinkBox struct {
	s      Sink
	packed bool
}

func newSinkBox(s Sink) *sinkBox {
	r, ok := s.(PackedHeaderReader)
	return &sinkBox{s: s, packed: ok && r.ReadsPackedHeaders()}
}

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
// subjects, consumer, ack_wait, max_ack_pending), the overflow mode, the
// dead-letter subject, sink.kind, sink.dedup_window or bucket.fair_key
// changed. The sink is swapped separately (SetSink), for one of the same
// kind: whether it reports and gates its writes (WireReporter, WireGater)
// is read once, by New.
func (l *Lane) Update(cfg config.Lane) error {
	old := l.conf()
	if !sameSource(old.Source, cfg.Source) || old.Bucket.Overflow != cfg.Bucket.Overflow ||
		old.DeadLetter != cfg.DeadLetter || old.Rate.Global != cfg.Rate.Global ||
		old.Sink.DedupWindow != cfg.Sink.DedupWindow || // the store is the lane's (WithDedup)
		old.Sink.Kind != cfg.Sink.Kind || // whether it reports and gates its writes is the lane's (New)
		old.Bucket.FairKey != cfg.Bucket.FairKey { // the bucket's queues are per key
		return ErrRestartNeeded
	}
	l.cfgp.Store(&cfg)
	now := time.Now()
	l.mu.Lock()
	l.setAdaptive(cfg)
	pc := l.pacerConfigNow(cfg, now)
	if l.global != nil && l.global.reducedNow.Load() {
		pc.Limit /= shaper.Limit(l.global.hint) // in fallback: stay at limit / replicas_hint
	}
	l.pacer.SetConfig(pc, now) // keeps the schedule and the credit (SPEC G2)
	l.setQuota(cfg, now)
	l.mu.Unlock()
	l.bucket.SetFreedThreshold(fetchLowWater(cfg.Bucket.Capacity)) // before SetCapacity signals
	l.bucket.SetCapacity(cfg.Bucket.Capacity)
	l.slots.setLimit(cfg.Task.MaxInFlight)
	l.updateBreaker(cfg, now)
	l.m.BucketCapacity.Set(float64(cfg.Bucket.Capacity))
	l.mem.update() // capacity and max_in_flight count in the memory limit (memory.go)
	l.nudgeHouse() // the gauges of the new rate (keepalive.go)
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
	old := l.sinkp.Swap(newSinkBox(s))
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
	l.pacer = shaper.NewPacer(l.pacerConfigNow(*l.conf(), time.Now()), time.Now()) // cold at start
	l.mu.Unlock()
	if pk, ok := l.src.(PinKeeper); ok && pk.Standby() {
		l.standby = laneStandby{pins: pk, done: make(chan struct{})}
	}
	go l.fetchLoop()
	mine, other := l.setupRelay()
	go l.departLoop(mine, other)
	go l.houseLoop()
	if l.standby.pins != nil {
		go l.pinLoop()
	}
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
		l.mem.leave(l)
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
	l.gate.close()
	l.stopWorkers()
	l.acks.flush() // every ack sent before Drain returns (the caller flushes the connection)
	close(l.houseStop)
	<-l.houseDone
	if l.standby.done != nil {
		<-l.standby.done
	}
	l.stopped.Store(true)
	l.mem.leave(l) // the bucket is empty and no task runs (memory.go)
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
