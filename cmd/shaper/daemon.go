package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
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
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/redisslots"
	"github.com/shaper-dev/shaper/sinks"
	"github.com/shaper-dev/shaper/sources"
)

// deadStream is the stream the daemon creates to capture dead letters.
const (
	deadStream   = "SHAPER_DEAD"
	deadSubjects = "shaper.dead.>"
)

// daemon wires a validated configuration into running lanes: NATS (embedded
// or external), one source, sink and lane per downstream, the admin endpoint.
type daemon struct {
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

	adminLn  net.Listener
	admin    *http.Server
	draining atomic.Bool
}

func newDaemon(cfg *config.Config, log *slog.Logger) *daemon {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &daemon{cfg: cfg, log: log, reg: reg, m: metrics.New(reg), stdout: os.Stdout,
		waiter: drain.NewPreciseWaiter}
}

// start brings everything up; on error it tears down what it started.
func (d *daemon) start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			d.close()
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
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := d.notReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	d.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.admin.Serve(d.adminLn) }()
	d.log.Info("admin listening", "addr", d.adminLn.Addr().String())

	url := d.cfg.NATS.URL
	if url == "" {
		if d.ns, err = sources.StartEmbedded(d.cfg.NATS.Embedded.Listen, d.cfg.NATS.Embedded.StoreDir); err != nil {
			return err
		}
		url = d.ns.ClientURL()
		d.log.Info("embedded nats started", "url", url, "store_dir", d.cfg.NATS.Embedded.StoreDir)
	}
	if d.nc, err = sources.Connect(url, d.log); err != nil {
		return err
	}
	if d.js, err = jetstream.New(d.nc); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := sources.EnsureStream(ctx, d.js, deadStream, []string{deadSubjects}); err != nil {
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
	d.lanes = map[string]*laneRec{}
	for _, name := range names {
		rec, err := d.newLane(ctx, name, d.cfg.Downstreams[name])
		if err != nil {
			return err
		}
		d.lanes[name] = rec
	}
	for _, rec := range d.lanes {
		rec.lane.Start()
	}
	d.log.Info("shaper ready", "lanes", len(d.lanes), "nats", url)
	return nil
}

// laneRec is one running lane with the parts the daemon owns.
type laneRec struct {
	cfg  config.Lane
	lane *drain.Lane
	src  *sources.JetStream
	sink drain.Sink
}

// newLane creates (but does not start) the lane name: its dead-letter
// stream when its subject has none, source, sink and lane.
func (d *daemon) newLane(ctx context.Context, name string, lc config.Lane) (*laneRec, error) {
	d.m.Lane(name, float64(lc.Rate.Limit)) // its series exist even when it fails to start (SPEC §6)
	// A dead_letter.subject outside shaper.dead.> needs a stream of its own,
	// or every dead letter would fail and be retried forever.
	if subj := lc.DeadLetter.Subject; subj != "" {
		if _, err := d.js.StreamNameBySubject(ctx, subj); err != nil {
			stream := "SHAPER_DEAD_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
			if err := sources.EnsureStream(ctx, d.js, stream, []string{subj}); err != nil {
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
	}, d.log.With("lane", name))
	if err != nil {
		return nil, fmt.Errorf("lane %q: %w", name, err)
	}
	sink, err := d.newSink(lc.Sink, lc.Task.MaxInFlight)
	if err != nil {
		return nil, fmt.Errorf("lane %q: sink: %w", name, err)
	}
	opts := []drain.Option{
		drain.WithLogger(d.log),
		drain.WithMetrics(d.m.Lane(name, float64(lc.Rate.Limit))),
		drain.WithWaiter(d.waiter()),
		drain.WithDeadLetter(sinks.NewNATS(d.js, lc.DeadLetter.Subject)),
	}
	if lc.Rate.Global {
		opts = append(opts, drain.WithGlobal(d.redis.Lane(name), d.cfg.Redis.ReplicasHint))
	}
	lane, err := drain.New(name, lc, src, sink, opts...)
	if err != nil {
		closeSink(sink)
		return nil, err
	}
	return &laneRec{cfg: lc, lane: lane, src: src, sink: sink}, nil
}

func closeSink(s drain.Sink) {
	if c, ok := s.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}

// startRedis creates the client of global rates (SPEC §3). Redis being
// unreachable at start is not fatal: global lanes begin in the local
// fallback and join the shared schedule when it answers.
func (d *daemon) startRedis(ctx context.Context) error {
	r, err := redisslots.NewRedisSlots(d.cfg.Redis, redisslots.WithRedisLogger(d.log))
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	d.redis = r
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	addr := d.cfg.Redacted().Redis.Addr
	if err := r.Load(lctx); err != nil {
		d.log.Warn("redis unreachable at start: global lanes pace locally at limit / replicas_hint until it answers",
			"redis", addr, "err", err)
		return nil
	}
	d.log.Info("global rates through redis", "redis", addr, "key_prefix", d.cfg.Redis.KeyPrefix,
		"replicas_hint", d.cfg.Redis.ReplicasHint)
	return nil
}

func (d *daemon) newSink(sc config.Sink, maxInFlight int) (drain.Sink, error) {
	build, ok := sinkKinds[sc.Kind]
	if !ok {
		return nil, fmt.Errorf("unknown sink kind %q", sc.Kind)
	}
	return build(d, sc, maxInFlight)
}

// sinkKinds builds a lane's sink by sink.kind: adding a kind is its file in
// sinks/, its keys in config, and one row here (docs/architecture.md).
var sinkKinds = map[string]func(d *daemon, sc config.Sink, maxInFlight int) (drain.Sink, error){
	config.SinkHTTP: func(d *daemon, sc config.Sink, maxInFlight int) (drain.Sink, error) {
		s, err := sinks.NewHTTP(sinks.HTTPConfig{URL: sc.URL, Method: sc.Method, Headers: sc.Headers,
			SuccessStatus: sc.SuccessStatus, RetryableStatus: sc.RetryableStatus},
			sinks.WithLogger(d.log), sinks.WithMaxIdleConnsPerHost(max(sinks.DefaultMaxIdleConnsPerHost, maxInFlight)))
		if err != nil {
			return nil, err
		}
		return s, nil
	},
	config.SinkNATS: func(d *daemon, sc config.Sink, _ int) (drain.Sink, error) {
		return sinks.NewNATS(d.js, sc.Subject), nil
	},
	config.SinkLog: func(d *daemon, _ config.Sink, _ int) (drain.Sink, error) {
		return sinks.NewLog(d.stdout), nil
	},
}

// notReady returns why the daemon is not ready, or "" (SPEC §6 /readyz).
func (d *daemon) notReady() string {
	switch {
	case d.draining.Load():
		return "draining"
	case d.nc == nil || !d.nc.IsConnected():
		return "nats not connected"
	}
	if !d.mu.TryLock() {
		return "reloading"
	}
	defer d.mu.Unlock()
	if d.lanes == nil {
		return "starting"
	}
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

// reload applies a new configuration (SIGHUP or a change of the file,
// issue 6): lanes whose settings can change in place are updated (rate,
// slack, warmup, capacity, timeouts, retries, max_in_flight, sink); a lane
// whose source or overflow mode changed is drained and started anew; new
// lanes start; removed lanes drain gracefully. Nothing held is nak'd by an
// in-place update. An invalid configuration changes nothing: its problems
// are logged and the running one stays. Settings outside downstreams (NATS,
// admin, log, shutdown, redis) need a restart; a change there is logged.
func (d *daemon) reload(ctx context.Context, cfg *config.Config) {
	if d.draining.Load() {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.cfg
	if !reflect.DeepEqual(old.NATS, cfg.NATS) || old.Admin != cfg.Admin || old.Log != cfg.Log ||
		old.Shutdown != cfg.Shutdown || !reflect.DeepEqual(old.Redis, cfg.Redis) {
		d.log.Warn("reload: changes outside downstreams need a restart; they were not applied")
	}
	drainTimeout := old.Shutdown.DrainTimeout
	retire := func(name string, rec *laneRec, why string) {
		d.log.Info("reload: draining lane", "lane", name, "why", why)
		d.retired.Add(1)
		go func() {
			defer d.retired.Done()
			dctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
			defer cancel()
			rec.lane.Drain(dctx)
			closeSink(rec.sink)
		}()
	}
	d.failed = map[string]string{} // retried below with the new configuration
	for name, rec := range d.lanes {
		lc, ok := cfg.Downstreams[name]
		if !ok {
			delete(d.lanes, name)
			retire(name, rec, "removed from the configuration")
			d.m.Remove(name)
			continue
		}
		if reflect.DeepEqual(rec.cfg, lc) {
			continue
		}
		err := rec.lane.Update(lc)
		if errors.Is(err, drain.ErrRestartNeeded) {
			// The replacement must not fetch before the old lane handed its
			// messages back: drain first, then start the new one.
			d.log.Info("reload: lane restarts (source, overflow or dead-letter changed)", "lane", name)
			dctx, cancel := context.WithTimeout(ctx, drainTimeout)
			rec.lane.Drain(dctx)
			cancel()
			closeSink(rec.sink)
			nrec, err := d.newLane(ctx, name, lc)
			if err != nil {
				d.log.Error("reload: lane could not restart", "lane", name, "err", err)
				delete(d.lanes, name)
				d.failed[name] = err.Error()
				continue
			}
			d.lanes[name] = nrec
			nrec.lane.Start()
			continue
		}
		if !reflect.DeepEqual(rec.cfg.Sink, lc.Sink) {
			sink, err := d.newSink(lc.Sink, lc.Task.MaxInFlight)
			if err != nil {
				d.log.Error("reload: new sink rejected; the old one stays", "lane", name, "err", err)
			} else {
				old := rec.lane.SetSink(sink)
				rec.sink = sink
				go closeSink(old) // waits for the calls still running
			}
		}
		rec.cfg = lc
	}
	for name, lc := range cfg.Downstreams {
		if _, ok := d.lanes[name]; ok {
			continue
		}
		rec, err := d.newLane(ctx, name, lc)
		if err != nil {
			d.log.Error("reload: new lane could not start (not ready until a reload fixes it)", "lane", name, "err", err)
			d.failed[name] = err.Error()
			continue
		}
		d.lanes[name] = rec
		rec.lane.Start()
		d.log.Info("reload: lane added", "lane", name)
	}
	d.cfg = cfg
	d.log.Info("configuration reloaded", "lanes", len(d.lanes))
}

// adminAddr returns the bound admin address (useful with port 0).
func (d *daemon) adminAddr() string { return d.adminLn.Addr().String() }

// natsURL returns the URL clients can publish to.
func (d *daemon) natsURL() string { return d.nc.ConnectedUrl() }

// drain stops all lanes gracefully (SPEC §3, Drain) and closes everything.
// ctx bounds the departing phase: the drain timeout, or a second signal.
func (d *daemon) drain(ctx context.Context) drain.Summary {
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
			closeSink(rec.sink)
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
	d.close()
	return total
}

// close flushes the acks to the server and closes every connection.
func (d *daemon) close() {
	if d.redis != nil {
		_ = d.redis.Close()
	}
	if d.nc != nil {
		if err := d.nc.FlushTimeout(5 * time.Second); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			d.log.Warn("flush before close failed: the last acks may be redelivered", "err", err)
		}
		d.nc.Close()
	}
	if d.ns != nil {
		if !waitAcksApplied(d.ns, 2*time.Second) {
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

// waitAcksApplied waits up to timeout until no consumer of the embedded
// server ns has acknowledgements queued or being applied, and reports
// whether that happened. The flush before it only proves that the server
// received the drain's acks and naks: a consumer queues them ("ackMsgs") and
// applies them on its own goroutine, and a shutdown drops what is still
// queued, so the handback nak of the last leftovers was lost and those
// messages came back only after ack_wait (found by TestE2EDrainOnSIGTERM).
func waitAcksApplied(ns *server.Server, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		busy := false
		// Without All, only queues with pending or in-progress work are listed.
		for name := range *ns.Ipqueuesz(&server.IpqueueszOptions{Filter: "ackMsgs"}) {
			if strings.HasSuffix(name, " ackMsgs") {
				busy = true
			}
		}
		if !busy {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}
