package redisslots

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/internal/testserver"
	"github.com/shaper-dev/shaper/metrics"
	"github.com/shaper-dev/shaper/sources"
)

// TestFallbackGaugeClearsWhileIdle: issue 12 — a global lane that fell back
// because redis-server was killed, and then has nothing to depart, sets
// shaper_global_limiter_fallback back to 0 within a few seconds of Redis
// answering again (it stayed at 1 until the next departure), and rejoins the
// shared schedule at its next departure. A real redis-server, stopped and
// restarted, and a real (embedded) NATS server.
func TestFallbackGaugeClearsWhileIdle(t *testing.T) {
	rd := startRedis(t)
	ns := testserver.NATS(t)
	ctx := context.Background()
	nc, err := sources.Connect(ns.ClientURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Lane{
		Source: config.Source{Stream: "IDLE", Subjects: []string{"idle.>"}, Consumer: "shaper-idle",
			AckWait: 30 * time.Second, MaxDeliver: 5},
		Bucket: config.Bucket{Capacity: 10, Overflow: config.OverflowBlock},
		Rate:   config.Rate{Limit: 50, Global: true, MinSpacing: 0.95, Warmup: config.Warmup{ColdFactor: 3}},
		Task: config.Task{Timeout: 5 * time.Second, MaxInFlight: 2,
			Retry: config.Retry{Backoff: []time.Duration{time.Second}, RetryAfter: true, MaxDelay: time.Minute}},
		DeadLetter: config.DeadLetter{Subject: "shaper.dead.idle"},
		Sink:       config.Sink{Kind: config.SinkLog},
	}
	src, err := sources.NewJetStream(ctx, js, sources.JetStreamConfig{Stream: cfg.Source.Stream, Subjects: cfg.Source.Subjects,
		Durable: cfg.Source.Consumer, AckWait: cfg.Source.AckWait, MaxAckPending: 12}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := NewRedisSlots(config.Redis{Addr: rd.Addr, KeyPrefix: "idle", Timeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	m := metrics.New(prometheus.NewRegistry()).Lane("idle", float64(cfg.Rate.Limit))
	down := &arrivals{ids: map[string]int{}}
	logs := &lockedLog{}
	lane, err := drain.New("idle", cfg, src, down, drain.WithMetrics(m),
		drain.WithLogger(slog.New(slog.NewTextHandler(logs, nil))), drain.WithGlobal(rs.Lane("idle"), 2))
	if err != nil {
		t.Fatal(err)
	}
	lane.Start()
	defer func() {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lane.Drain(dctx)
		cancel()
	}()
	sent := 0
	publishAndWait := func(what string) {
		t.Helper()
		if _, err := js.Publish(ctx, "idle.job", fmt.Appendf(nil, "job-%d", sent)); err != nil {
			t.Fatal(err)
		}
		sent++
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, _, n := down.snapshot(); n == sent {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: message %d not delivered after 10 s\n%s", what, sent, logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitGauge := func(want float64, within time.Duration, what string) time.Duration {
		t.Helper()
		start := time.Now()
		for testutil.ToFloat64(m.Fallback) != want {
			if time.Since(start) > within {
				t.Fatalf("%s: fallback gauge %v after %v, want %v\n%s", what, testutil.ToFloat64(m.Fallback), within, want, logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return time.Since(start)
	}

	publishAndWait("on the shared schedule")
	waitGauge(0, 0, "on the shared schedule")
	rd.Kill()
	publishAndWait("redis killed")
	waitGauge(1, 2*time.Second, "redis killed, one departure")
	// Idle in fallback for a few probe intervals: the gauge stays at 1.
	time.Sleep(2500 * time.Millisecond)
	waitGauge(1, 0, "redis still down, lane idle")
	rd.Start()
	took := waitGauge(0, 4*time.Second, "redis back, lane idle")
	t.Logf("fallback gauge back to 0 %v after redis answered, with no departure", took.Round(time.Millisecond))
	if _, _, n := down.snapshot(); n != sent {
		t.Fatalf("%d delivered, want %d: a departure cleared the gauge, the test would prove nothing", n, sent)
	}
	if !strings.Contains(logs.String(), "redis answers again") {
		t.Errorf("no log line says redis answers again:\n%s", logs)
	}
	// The next departure takes the shared schedule again, once.
	publishAndWait("redis back")
	time.Sleep(300 * time.Millisecond)
	if v := testutil.ToFloat64(m.Fallback); v != 0 {
		t.Errorf("fallback gauge %v after a departure with redis back, want 0", v)
	}
	if n := strings.Count(logs.String(), "global rate restored"); n != 1 {
		t.Errorf("%d 'global rate restored' lines, want 1:\n%s", n, logs)
	}
}

// lockedLog is a log buffer safe for the lane's goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedLog) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
