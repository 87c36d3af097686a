// Package daemon wires a validated configuration into running lanes: NATS
// (embedded or external), one source, sink and lane per downstream, the
// admin endpoint, and the reload policy. cmd/shaper starts it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/admin"
	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/redisslots"
	"github.com/shaper-dev/shaper/sinks"
	"github.com/shaper-dev/shaper/sources"
)

// DeadStream is the stream the daemon creates to capture dead letters, on
// DeadSubjects (the default dead_letter.subject is shaper.dead.<lane>).
const (
	DeadStream   = "SHAPER_DEAD"
	DeadSubjects = "shaper.dead.>"
)

// Daemon wires a validated configuration into running lanes: NATS (embedded
// or external), one source, sink and lane per downstream, the admin endpoint.
type Daemon struct {
	cfg    *config.Config
	log    *slog.Logger
	reg    *prometheus.Registry
	m      *metrics.Metrics
	stdout io.Writer
	waiter func() drain.Waiter

	ns      *server.Server
	nc      *nats.Conn
	js      jetstream.JetStream
	mu      sync.Mutex
	lanes   map[string]*laneRec
	failed  map[string]string      // lanes a reload could not start: why
	retired sync.WaitGroup         // lanes draining after a reload removed them
	redis   *redisslots.RedisSlots // global rates; nil when no lane has rate.global
	mem     *drain.MemoryBudget    // the soft memory limit from the buckets; nil: GOMEMLIMIT set, or nats.embedded

	control *sources.Control // operators' decisions (SHAPER_CONTROL)
	ctlStop func()           // stops the control watch
	ctlMu   sync.Mutex       // guards ctl
	ctl     map[string]sources.LaneControl
	liveMu  sync.RWMutex // guards live: the lanes the admin API sees
	live    map[string]*laneRec

	adminLn  net.Listener
	admin    *http.Server
	draining atomic.Bool
	started  atomic.Bool // every lane of the first configuration started
}

// New returns a daemon for cfg (already validated); stdout receives what a
// log sink prints. Nothing starts before Start.
func New(cfg *config.Config, log *slog.Logger, stdout io.Writer) *Daemon {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d := &Daemon{cfg: cfg, log: log, reg: reg, m: metrics.New(reg), stdout: stdout,
		waiter: drain.NewPreciseWaiter}
	d.m.ConfigLoaded(true, time.Now()) // cfg was loaded and validated
	return d
}

// Start brings everything up; on error it tears down what it started.
func (d *Daemon) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	// Every series of every lane exists before /metrics answers (SPEC §6).
	for name := range d.cfg.Downstreams {
		d.m.Lane(name, float64(d.cfg.Downstreams[name].Rate.Limit)).BucketCapacity.Set(float64(d.cfg.Downstreams[name].Bucket.Capacity))
	}
	// Admin first, so /healthz answers and /readyz says "not yet".
	if d.adminLn, err = net.Listen("tcp", d.cfg.Admin.Listen); err != nil {
		return fmt.Errorf("admin.listen %s: %w", d.cfg.Admin.Listen, err)
	}
	d.admin = &http.Server{Handler: admin.NewHandler(d.reg, d, d.cfg.Admin.Token, d.log), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.admin.Serve(d.adminLn) }()
	d.log.Info("admin listening", "addr", d.adminLn.Addr().String())

	url := d.cfg.NATS.URL
	if url == "" {
		if d.ns, err = sources.StartEmbedded(d.cfg.NATS.Embedded.Listen, d.cfg.NATS.Embedded.StoreDir); err != nil {
			return err
		}
		url = d.ns.ClientURL()
		d.log.Info("embedded nats started", "url", config.RedactURL(url), "store_dir", d.cfg.NATS.Embedded.StoreDir)
	} else {
		// Not with the embedded server: its store's caches share the heap,
		// and the limit counts only what the buckets may hold (drain/memory.go).
		d.mem = drain.NewMemoryBudget(d.log)
	}
	sec, err := sources.Security{Creds: d.cfg.NATS.Creds, CAFile: d.cfg.NATS.TLS.CAFile,
		CertFile: d.cfg.NATS.TLS.CertFile, KeyFile: d.cfg.NATS.TLS.KeyFile}.Options()
	if err != nil {
		return err
	}
	if d.nc, err = sources.Connect(url, d.log, sec...); err != nil {
		return err
	}
	if d.js, err = jetstream.New(d.nc); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := sources.CheckJetStream(ctx, d.js, config.RedactURL(url)); err != nil {
		return err
	}
	if err := sources.EnsureStreamLimits(ctx, d.js, DeadStream, []string{DeadSubjects}, deadLetterLimits(d.cfg.DeadLetterStream, maxReplicas(d.cfg)), d.log); err != nil {
		return fmt.Errorf("dead-letter stream: %w", err)
	}
	names := make([]string, 0, len(d.cfg.Downstreams))
	for name := range d.cfg.Downstreams {
		names = append(names, name)
		if d.cfg.Downstreams[name].Rate.Global && d.redis == nil {
			if err := d.startRedis(ctx); err != nil {
				return err
			}
		}
	}
	sort.Strings(names)
	if err := d.startControl(ctx); err != nil {
		return err
	}
	// The lanes are built and started under d.mu: /readyz must not see a
	// half-filled map (it said ready while the lanes were still being
	// created, before any had started).
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lanes = map[string]*laneRec{}
	for _, name := range names {
		rec, err := d.newLane(ctx, name, d.cfg.Downstreams[name])
		if err != nil {
			return err
		}
		d.setLane(name, rec)
	}
	for _, rec := range d.lanes {
		rec.lane.Start()
	}
	d.started.Store(true)
	d.log.Info("shaper ready", "lanes", len(d.lanes), "nats", config.RedactURL(url)) // credentials masked (issue 12)
	return nil
}

// laneRec is one running lane with the parts the daemon owns.
type laneRec struct {
	cfg  config.Lane
	lane *drain.Lane
	src  *sources.JetStream
	sink drain.Sink
	dead drain.Sink // the dead-letter publisher (its own connection once used)
	// deadCount is the last count of the lane's dead letters read (the
	// admin API shows it when NATS does not answer).
	deadCount atomic.Uint64
}

// newLane creates (but does not start) the lane name: its dead-letter
// stream when its subject has none, source, sink and lane.
func (d *Daemon) newLane(ctx context.Context, name string, lc config.Lane) (*laneRec, error) {
	d.m.Lane(name, float64(lc.Rate.Limit)) // its series exist even when it fails to start (SPEC §6)
	// A dead_letter.subject outside shaper.dead.> needs a stream of its own,
	// or every dead letter would fail and be retried forever.
	if subj := lc.DeadLetter.Subject; subj != "" {
		if _, err := d.js.StreamNameBySubject(ctx, subj); err != nil {
			stream := "SHAPER_DEAD_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
			if err := sources.EnsureStreamLimits(ctx, d.js, stream, []string{subj}, deadLetterLimits(d.cfg.DeadLetterStream, maxReplicas(d.cfg)), d.log); err != nil {
				return nil, fmt.Errorf("lane %q: dead-letter stream for %q: %w", name, subj, err)
			}
			d.log.Info("dead-letter stream created", "lane", name, "stream", stream, "subject", subj)
		}
	}
	if lc.Rate.Global && d.redis == nil {
		if err := d.startRedis(ctx); err != nil {
			return nil, err
		}
	}
	src, err := sources.NewJetStream(ctx, d.js, sources.JetStreamConfig{
		Stream: lc.Source.Stream, Subjects: lc.Source.Subjects, Durable: lc.Source.Consumer,
		AckWait: lc.Source.AckWait, MaxAckPending: lc.EffectiveMaxAckPending(),
		Limits: sourceLimits(lc.Source.Retention, lc.Source.Replicas), Standby: lc.Source.Standby,
	}, d.log.With("lane", name))
	if err != nil {
		return nil, fmt.Errorf("lane %q: %w", name, err)
	}
	sink, err := d.newSink(lc.Sink, lc.Task.MaxInFlight)
	if err != nil {
		return nil, fmt.Errorf("lane %q: sink: %w", name, err)
	}
	dead := sinks.NewNATS(d.js, lc.DeadLetter.Subject)
	opts := []drain.Option{
		drain.WithLogger(d.log),
		drain.WithMetrics(d.m.Lane(name, float64(lc.Rate.Limit))),
		drain.WithWaiter(d.waiter()),
		drain.WithDeadLetter(dead),
		drain.WithMemoryBudget(d.mem),
	}
	if lc.Rate.Global {
		opts = append(opts, drain.WithGlobal(d.redis.Lane(name), d.cfg.Redis.ReplicasHint))
	}
	if w := lc.Sink.DedupWindow; w > 0 { // SPEC §3 Delivered-key dedup
		dd, err := sources.NewKVDedup(ctx, d.js, name, w, lc.Source.Replicas) // as replicated as the lane's stream
		if err != nil {
			closeSink(sink)
			closeSink(dead)
			return nil, fmt.Errorf("lane %q: sink.dedup_window: %w", name, err)
		}
		opts = append(opts, drain.WithDedup(dd))
	}
	lane, err := drain.New(name, lc, src, sink, opts...)
	if err != nil {
		closeSink(sink)
		closeSink(dead)
		return nil, err
	}
	d.applyStored(name, lane) // an operator's pause or purge kept on the server
	return &laneRec{cfg: lc, lane: lane, src: src, sink: sink, dead: dead}, nil
}

// startRedis creates the client of global rates (SPEC §3). Redis being
// unreachable at start is not fatal: global lanes begin in the local
// fallback and join the shared schedule when it answers.
func (d *Daemon) startRedis(ctx context.Context) error {
	r, err := redisslots.NewRedisSlots(d.cfg.Redis, redisslots.WithRedisLogger(d.log))
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	d.redis = r
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	addr := config.RedactURL(d.cfg.Redacted().Redis.Addr)
	if err := r.Load(lctx); err != nil {
		d.log.Warn("redis unreachable at start: global lanes pace locally at limit / replicas_hint until it answers",
			"redis", addr, "err", err)
		return nil
	}
	d.log.Info("global rates through redis", "redis", addr, "key_prefix", d.cfg.Redis.KeyPrefix,
		"replicas_hint", d.cfg.Redis.ReplicasHint)
	return nil
}

// NotReady returns why the daemon is not ready, or "" (SPEC §6 /readyz).
func (d *Daemon) NotReady() string {
	switch {
	case d.draining.Load():
		return "draining"
	case d.nc == nil || !d.nc.IsConnected():
		return "nats not connected"
	}
	if !d.started.Load() {
		return "starting"
	}
	if !d.mu.TryLock() {
		return "reloading"
	}
	defer d.mu.Unlock()
	for name, why := range d.failed {
		return "lane " + name + " failed to start: " + why
	}
	for name, rec := range d.lanes {
		if !rec.src.Bound() {
			return "consumer of lane " + name + " not bound"
		}
	}
	return ""
}

// AdminAddr returns the bound admin address (useful with port 0).
func (d *Daemon) AdminAddr() string { return d.adminLn.Addr().String() }

// Metrics returns the daemon's metrics (the series of SPEC §6).
func (d *Daemon) Metrics() *metrics.Metrics { return d.m }

// NATSURL returns the URL clients can publish to.
func (d *Daemon) NATSURL() string { return d.nc.ConnectedUrl() }

// Drain stops all lanes gracefully (SPEC §3, Drain) and closes everything.
// ctx bounds the departing phase: the drain timeout, or a second signal.
func (d *Daemon) Drain(ctx context.Context) drain.Summary {
	d.draining.Store(true)
	var (
		mu    sync.Mutex
		total drain.Summary
		wg    sync.WaitGroup
	)
	d.mu.Lock()
	recs := make([]*laneRec, 0, len(d.lanes))
	for _, rec := range d.lanes {
		recs = append(recs, rec)
	}
	d.mu.Unlock()
	for _, rec := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := rec.lane.Drain(ctx)
			rec.closeSinks()
			mu.Lock()
			total.Delivered += s.Delivered
			total.Nacked += s.Nacked
			total.DeadLettered += s.DeadLettered
			total.Leftovers += s.Leftovers
			mu.Unlock()
		}()
	}
	wg.Wait()
	d.retired.Wait()
	d.Close()
	return total
}

// Close flushes the acks to the server and closes every connection.
func (d *Daemon) Close() {
	if d.redis != nil {
		_ = d.redis.Close()
	}
	if d.ctlStop != nil {
		d.ctlStop()
	}
	if d.nc != nil {
		if err := d.nc.FlushTimeout(5 * time.Second); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			d.log.Warn("flush before close failed: the last acks may be redelivered", "err", err)
		}
		d.nc.Close()
	}
	if d.ns != nil {
		if !sources.WaitAcksApplied(d.ns, 2*time.Second) {
			d.log.Warn("embedded nats still applying acks at shutdown: the last ones may be redelivered after ack_wait")
		}
		d.ns.Shutdown()
		d.ns.WaitForShutdown()
	}
	if d.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = d.admin.Shutdown(ctx)
		cancel()
	}
}
