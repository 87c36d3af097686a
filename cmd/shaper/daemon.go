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
	"github.com/shaper-dev/shaper/shaper"
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
	waiter func() shaper.Waiter

	ns    *server.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	lanes []*drain.Lane
	srcs  []*sources.JetStream
	sinks []interface{ Close() error }
	redis *sources.RedisSlots // global rates; nil when no lane has rate.global

	adminLn  net.Listener
	admin    *http.Server
	draining atomic.Bool
}

func newDaemon(cfg *config.Config, log *slog.Logger) *daemon {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &daemon{cfg: cfg, log: log, reg: reg, m: metrics.New(reg), stdout: os.Stdout,
		waiter: shaper.NewPreciseWaiter}
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
		d.m.Lane(name).BucketCapacity.Set(float64(d.cfg.Downstreams[name].Bucket.Capacity))
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
	// A dead_letter.subject outside shaper.dead.> needs a stream of its own,
	// or every dead letter would fail and be retried forever.
	for name, lc := range d.cfg.Downstreams {
		subj := lc.DeadLetter.Subject
		if _, err := d.js.StreamNameBySubject(ctx, subj); err == nil {
			continue
		}
		stream := "SHAPER_DEAD_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
		if err := sources.EnsureStream(ctx, d.js, stream, []string{subj}); err != nil {
			return fmt.Errorf("lane %q: dead-letter stream for %q: %w", name, subj, err)
		}
		d.log.Info("dead-letter stream created", "lane", name, "stream", stream, "subject", subj)
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
	for _, name := range names {
		lc := d.cfg.Downstreams[name]
		mpa := lc.EffectiveMaxAckPending()
		src, err := sources.NewJetStream(ctx, d.js, sources.JetStreamConfig{
			Stream: lc.Source.Stream, Subjects: lc.Source.Subjects, Durable: lc.Source.Consumer,
			AckWait: lc.Source.AckWait, MaxAckPending: mpa,
		}, d.log.With("lane", name))
		if err != nil {
			return fmt.Errorf("lane %q: %w", name, err)
		}
		sink, err := d.newSink(lc.Sink, lc.Task.MaxInFlight)
		if err != nil {
			return fmt.Errorf("lane %q: sink: %w", name, err)
		}
		opts := []drain.Option{
			drain.WithLogger(d.log),
			drain.WithMetrics(d.m.Lane(name)),
			drain.WithWaiter(d.waiter()),
			drain.WithDeadLetter(sinks.NewNATS(d.js, lc.DeadLetter.Subject)),
		}
		if lc.Rate.Global {
			opts = append(opts, drain.WithGlobal(d.redis.Lane(name, lc.Rate.Slack), d.cfg.Redis.ReplicasHint))
		}
		lane, err := drain.New(name, lc, src, sink, opts...)
		if err != nil {
			return err
		}
		d.srcs = append(d.srcs, src)
		d.lanes = append(d.lanes, lane)
	}
	for _, l := range d.lanes {
		l.Start()
	}
	d.log.Info("shaper ready", "lanes", len(d.lanes), "nats", url)
	return nil
}

// startRedis creates the client of global rates (SPEC §3). Redis being
// unreachable at start is not fatal: global lanes begin in the local
// fallback and join the shared schedule when it answers.
func (d *daemon) startRedis(ctx context.Context) error {
	r, err := sources.NewRedisSlots(d.cfg.Redis, sources.WithRedisLogger(d.log))
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
	switch sc.Kind {
	case "http":
		s, err := sinks.NewHTTP(sinks.HTTPConfig{URL: sc.URL, Method: sc.Method, Headers: sc.Headers,
			SuccessStatus: sc.SuccessStatus, RetryableStatus: sc.RetryableStatus},
			sinks.WithLogger(d.log), sinks.WithMaxIdleConnsPerHost(max(sinks.DefaultMaxIdleConnsPerHost, maxInFlight)))
		if err != nil {
			return nil, err
		}
		d.sinks = append(d.sinks, s)
		return s, nil
	case "nats":
		s := sinks.NewNATS(d.js, sc.Subject)
		d.sinks = append(d.sinks, s)
		return s, nil
	case "log":
		s := sinks.NewLog(d.stdout)
		d.sinks = append(d.sinks, s)
		return s, nil
	}
	return nil, fmt.Errorf("unknown sink kind %q", sc.Kind)
}

// notReady returns why the daemon is not ready, or "" (SPEC §6 /readyz).
func (d *daemon) notReady() string {
	switch {
	case d.draining.Load():
		return "draining"
	case d.nc == nil || !d.nc.IsConnected():
		return "nats not connected"
	case len(d.srcs) < len(d.cfg.Downstreams):
		return "starting"
	}
	for _, s := range d.srcs {
		if !s.Bound() {
			return "consumer not bound"
		}
	}
	return ""
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
	for _, l := range d.lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := l.Drain(ctx)
			mu.Lock()
			total.Delivered += s.Delivered
			total.Nacked += s.Nacked
			total.DeadLettered += s.DeadLettered
			total.Leftovers += s.Leftovers
			mu.Unlock()
		}()
	}
	wg.Wait()
	d.close()
	return total
}

// close flushes the acks to the server and closes every connection.
func (d *daemon) close() {
	for _, s := range d.sinks {
		_ = s.Close()
	}
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
		d.ns.Shutdown()
		d.ns.WaitForShutdown()
	}
	if d.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = d.admin.Shutdown(ctx)
		cancel()
	}
}
