package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources"
)

// payloadSize is the size of every benchmark message's payload, in bytes.
const payloadSize = 256

// stream is one benchmark stream, filled once and read whole by each
// consumer.
type stream struct {
	name    string
	subject string // what producers publish to; the stream captures prefix.>
	prefix  string
	n       int
}

func newStream(name, prefix string) *stream {
	return &stream{name: name, prefix: prefix, subject: prefix + ".jobs"}
}

func (s *stream) filter() string { return s.prefix + ".>" }

// natsEnv is an embedded NATS server with JetStream (the product's default,
// started with sources.StartEmbedded) holding one stream of n messages.
type natsEnv struct {
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	seq atomic.Int64 // for consumer names
}

func startNATS(dir string) (*natsEnv, error) {
	srv, err := sources.StartEmbedded("127.0.0.1:0", dir)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.Name("shaper-bench"))
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		srv.Shutdown()
		return nil, err
	}
	return &natsEnv{srv: srv, nc: nc, js: js}, nil
}

func (e *natsEnv) close() {
	e.nc.Close()
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// fill creates the stream (file storage, as the source creates it) and
// publishes n messages of payloadSize bytes, each with a Nats-Msg-Id header
// like a producer that wants idempotency (SPEC G8).
func (e *natsEnv) fill(ctx context.Context, st *stream, n int) error {
	if err := sources.EnsureStream(ctx, e.js, st.name, []string{st.filter()}); err != nil {
		return err
	}
	data := make([]byte, payloadSize)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	for i := range n {
		m := &nats.Msg{Subject: st.subject, Data: data, Header: nats.Header{}}
		m.Header.Set(shaper.MsgIDHeader, "job-"+strconv.Itoa(i))
		if _, err := e.js.PublishMsgAsync(m); err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		// Wait for the acks every 1,000 messages: the client refuses to
		// have more than a few thousand outstanding.
		if (i+1)%1000 == 0 || i == n-1 {
			select {
			case <-e.js.PublishAsyncComplete():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	st.n = n
	return nil
}

func (e *natsEnv) consumerName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, e.seq.Add(1))
}

// createConsumer makes a durable pull consumer reading the whole stream, as
// sources.JetStream configures it.
func (e *natsEnv) createConsumer(ctx context.Context, st *stream, name string, maxAckPending int) (jetstream.Consumer, error) {
	return e.js.CreateOrUpdateConsumer(ctx, st.name, jetstream.ConsumerConfig{
		Durable:       name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       60 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: st.filter(),
	})
}

// settled waits until the server saw an ack for every message of consumer
// name (acks are fire-and-forget), then deletes the consumer.
func (e *natsEnv) settled(ctx context.Context, st *stream, name string) error {
	if err := e.nc.Flush(); err != nil {
		return err
	}
	defer func() { _ = e.js.DeleteConsumer(context.Background(), st.name, name) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := e.js.Consumer(ctx, st.name, name)
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= uint64(st.n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer %s: %d pending, %d unacked, ack floor %d of %d",
				name, info.NumPending, info.NumAckPending, info.AckFloor.Stream, st.n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// laneConfig is a lane as config.Load would build it with the defaults
// (capacity 1000, max_in_flight 8, overflow block), at limit and slack.
func laneConfig(streamName, filter, consumer string, limit float64, slack int) config.Lane {
	return config.Lane{
		Source: config.Source{
			Stream: streamName, Subjects: []string{filter}, Consumer: consumer,
			AckWait: config.DefaultAckWait, MaxDeliver: config.DefaultMaxDeliver,
		},
		Bucket: config.Bucket{Capacity: config.DefaultCapacity, Overflow: config.DefaultOverflow},
		Rate:   config.Rate{Limit: shaper.Limit(limit), Slack: slack, Warmup: config.Warmup{ColdFactor: config.DefaultColdFactor}},
		Task: config.Task{
			Timeout: config.DefaultTaskTimeout, MaxInFlight: config.DefaultMaxInFlight,
			Retry: config.Retry{Backoff: config.DefaultBackoff(), RetryAfter: config.DefaultRetryAfter, MaxDelay: config.DefaultMaxDelay},
		},
		DeadLetter: config.DeadLetter{Subject: config.DefaultDeadLetterPrefix + "bench"},
		Sink:       config.Sink{Kind: "log"},
	}
}

// countSink is a no-op sink that stamps each Send and closes done at the
// target count.
type countSink struct {
	target int
	n      atomic.Int64
	done   chan struct{}
	mu     sync.Mutex
	at     []time.Time
	stamp  bool
}

func newCountSink(target int, stamp bool) *countSink {
	s := &countSink{target: target, done: make(chan struct{}), stamp: stamp}
	if stamp {
		s.at = make([]time.Time, 0, target)
	}
	return s
}

func (s *countSink) Send(context.Context, *shaper.Message) error {
	s.hit()
	return nil
}

// ReadsPackedHeaders implements drain.PackedHeaderReader: the no-op sink
// reads no header, as the daemon's own sinks read them packed.
func (s *countSink) ReadsPackedHeaders() bool { return true }

func (s *countSink) hit() {
	if s.stamp {
		now := time.Now()
		s.mu.Lock()
		s.at = append(s.at, now)
		s.mu.Unlock()
	}
	if int(s.n.Add(1)) == s.target {
		close(s.done)
	}
}

func (s *countSink) wait(timeout time.Duration) error {
	select {
	case <-s.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("timed out: %d of %d delivered", s.n.Load(), s.target)
	}
}

// sorted returns the Send instants in order (tasks run concurrently, so the
// order of appends may differ from the order of the instants by a little).
func (s *countSink) sorted() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := slices.Clone(s.at)
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	return at
}

// endToEnd is one row of the throughput and overhead sections.
type endToEnd struct {
	name      string
	n         int
	elapsed   time.Duration
	perSecond float64 // n / elapsed, or from first to last delivery at a fixed rate
	cpuPerMsg time.Duration
	allocs    float64 // per message
	switches  float64 // context switches of the process per message
	max10ms   int     // most deliveries in any 10 ms window (fixed-rate rows)
	err       error
	load      float64 // other processes' share of the machine meanwhile

	// Shaper lanes only.
	diag    bool
	late    lateness // the precise waiter's wake-ups
	fetches int64    // pull requests (Source.Fetch calls)
	asked   int64    // messages asked for in all
}

type meter struct {
	t0      time.Time
	cpu0    time.Duration
	csw0    int64
	mallocs uint64
	load    loadMeter
}

func startMeter() meter {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return meter{t0: time.Now(), cpu0: cpuTime(), csw0: contextSwitches(), mallocs: ms.Mallocs, load: startLoad()}
}

func (m meter) stop(r *endToEnd) {
	r.elapsed = time.Since(m.t0)
	r.load = m.load.other()
	cpu := cpuTime() - m.cpu0
	csw := contextSwitches() - m.csw0
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if r.n > 0 {
		r.cpuPerMsg = cpu / time.Duration(r.n)
		r.allocs = float64(ms.Mallocs-m.mallocs) / float64(r.n)
		r.switches = float64(csw) / float64(r.n)
		if r.perSecond == 0 {
			r.perSecond = float64(r.n) / r.elapsed.Seconds()
		}
	}
}

// runLane runs a shaper lane over the whole stream st with a no-op sink at
// limit/slack and measures it from Start to the last Send.
func (e *natsEnv) runLane(ctx context.Context, st *stream, name string, limit float64, slack int, stamp bool) endToEnd {
	consumer := e.consumerName("shaper")
	cfg := laneConfig(st.name, st.filter(), consumer, limit, slack)
	src, err := sources.NewJetStream(ctx, e.js, sources.JetStreamConfig{
		Stream: cfg.Source.Stream, Subjects: cfg.Source.Subjects, Durable: consumer,
		AckWait: cfg.Source.AckWait, MaxAckPending: cfg.EffectiveMaxAckPending(),
	}, nil)
	if err != nil {
		return endToEnd{name: name, n: st.n, err: err}
	}
	r := runLaneOn(ctx, name, cfg, src, st.n, stamp)
	if r.err == nil {
		r.err = e.settled(ctx, st, consumer)
	}
	return r
}

// envNoGCFloor, set to 1, runs the shaper rows without the GC floor that
// `shaper run` starts (drain.StartGCFloor): to measure what the floor gives.
const envNoGCFloor = "SHAPERBENCH_NO_GC_FLOOR"

// shaperGC starts the GC floor `shaper run` starts (drain/memory.go) for a
// shaper row and returns what stops it. GOGC is the process's, so the
// contenders (the bare consumers, the hand-rolled loops) run after it with
// Go's default, as a program that does not set GOGC does; a GOGC in the
// environment holds for every row (StartGCFloor then does nothing).
func shaperGC() func() {
	if os.Getenv(envNoGCFloor) != "" {
		return func() {}
	}
	return drain.StartGCFloor(nil).Stop
}

// gcSetting says, for the report, how the rows' collector ran.
func gcSetting() string {
	switch {
	case os.Getenv("GOGC") != "":
		return "GOGC=" + os.Getenv("GOGC") + " from the environment, every row (the downstream child processes too)"
	case os.Getenv(envNoGCFloor) != "":
		return "Go's default (GOGC=100) for every row: " + envNoGCFloor + " is set"
	}
	return "the shaper rows with the GC floor `shaper run` starts (drain.StartGCFloor: heap goal ≥ 32 MiB); the other contenders with Go's default GOGC=100"
}

// runLaneOn runs a lane with cfg on src until n messages reached the no-op
// sink, then drains it. It records the waiter's lateness and the pull
// requests made.
func runLaneOn(ctx context.Context, name string, cfg config.Lane, src drain.Source, n int, stamp bool, opts ...drain.Option) endToEnd {
	r := endToEnd{name: name, n: n}
	sink := newCountSink(n, stamp)
	cs := &countSource{inner: src}
	rw := &recWaiter{inner: drain.NewPreciseWaiter()}
	lane, err := drain.New("bench", cfg, cs, sink, append([]drain.Option{
		drain.WithMetrics(metrics.New(prometheus.NewRegistry()).Lane("bench", float64(cfg.Rate.Limit))),
		drain.WithWaiter(rw)}, opts...)...)
	if err != nil {
		r.err = err
		return r
	}
	defer shaperGC()()
	m := startMeter()
	lane.Start()
	r.err = sink.wait(time.Minute)
	m.stop(&r)
	r.late = rw.summary(cfg.Rate.Limit.Interval())
	r.fetches, r.asked = cs.fetches.Load(), cs.asked.Load()
	r.diag = true
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	lane.Drain(dctx)
	cancel()
	if stamp {
		fixedRate(&r, sink.sorted())
	}
	return r
}

// fixedRate replaces the rate of r by first-to-last deliveries and fills in
// the window column.
func fixedRate(r *endToEnd, at []time.Time) {
	if len(at) < 2 {
		return
	}
	r.perSecond = float64(len(at)-1) / at[len(at)-1].Sub(at[0]).Seconds()
	off := make([]time.Duration, len(at))
	for i := range at {
		off[i] = at[i].Sub(at[0])
	}
	r.max10ms = maxInWindow(off, 10*time.Millisecond)
}

// runConsume runs a bare nats.go pull consumer (Consume with a callback that
// optionally waits on a hand-rolled limiter, then acks) over the whole stream.
func (e *natsEnv) runConsume(ctx context.Context, st *stream, name string, wait func(), stamp bool) endToEnd {
	r := endToEnd{name: name, n: st.n}
	consumer := e.consumerName("bare")
	c, err := e.createConsumer(ctx, st, consumer, config.DefaultCapacity+config.DefaultMaxInFlight)
	if err != nil {
		r.err = err
		return r
	}
	sink := newCountSink(st.n, stamp)
	m := startMeter()
	cc, err := c.Consume(func(msg jetstream.Msg) {
		if wait != nil {
			wait()
		}
		sink.hit()
		_ = msg.Ack()
	})
	if err != nil {
		r.err = err
		return r
	}
	r.err = sink.wait(time.Minute)
	m.stop(&r)
	cc.Stop()
	<-cc.Closed()
	if r.err == nil {
		r.err = e.settled(ctx, st, consumer)
	}
	if stamp {
		fixedRate(&r, sink.sorted())
	}
	return r
}

// runFetch runs a bare Fetch loop (batches of the lane's default capacity,
// one pull request at a time, like sources.JetStream) with an ack per message.
func (e *natsEnv) runFetch(ctx context.Context, st *stream, name string) endToEnd {
	r := endToEnd{name: name, n: st.n}
	consumer := e.consumerName("fetch")
	c, err := e.createConsumer(ctx, st, consumer, config.DefaultCapacity+config.DefaultMaxInFlight)
	if err != nil {
		r.err = err
		return r
	}
	m := startMeter()
	got := 0
	for got < st.n && r.err == nil {
		b, err := c.Fetch(min(config.DefaultCapacity, st.n-got), jetstream.FetchMaxWait(sources.FetchExpiry))
		if err != nil {
			r.err = err
			break
		}
		for msg := range b.Messages() {
			got++
			_ = msg.Ack()
		}
		if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			r.err = err
		}
	}
	m.stop(&r)
	if r.err == nil {
		r.err = e.settled(ctx, st, consumer)
	}
	return r
}

// hand-rolled limiters of the overhead section.
func xrateWait(perSecond float64) func() {
	lim := rate.NewLimiter(rate.Limit(perSecond), 1)
	return func() { _ = lim.Wait(context.Background()) }
}

func uberWait(perSecond float64) func() {
	rl := ratelimit.New(int(perSecond))
	return func() { rl.Take() }
}

func uberWaitNoSlack(perSecond float64) func() {
	rl := ratelimit.New(int(perSecond), ratelimit.WithoutSlack)
	return func() { rl.Take() }
}
