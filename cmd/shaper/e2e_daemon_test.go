package main

// The daemon in process.

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/daemon"
	"github.com/shaper-dev/shaper/config"
)

// syncBuffer is a bytes.Buffer safe for concurrent writers (slog handlers).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testDaemon is a daemon started in the test process.
type testDaemon struct {
	*daemon.Daemon
	cfg     *config.Config
	logs    *syncBuffer
	drained bool
}

// startDaemon loads cfgText the way `shaper run` does and starts the daemon.
// A cleanup drains it (if the test did not) and prints its logs when the
// test failed.
func startDaemon(t *testing.T, cfgText string) *testDaemon {
	t.Helper()
	cfg, warns, err := config.Load(writeFile(t, "config.yaml", cfgText), nil)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	for _, w := range warns {
		t.Logf("config warning: %s", w)
	}
	td, err := startLoaded(t, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	return td
}

// startLoaded starts a daemon for a loaded cfg, capturing its logs, with
// startDaemon's cleanup; a failed Start is returned with the daemon.
func startLoaded(t *testing.T, cfg *config.Config) (*testDaemon, error) {
	t.Helper()
	logs := &syncBuffer{}
	d := daemon.New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), io.Discard)
	td := &testDaemon{Daemon: d, cfg: cfg, logs: logs}
	t.Cleanup(func() {
		if !td.drained {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			td.Drain(ctx)
			cancel()
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", logs.String())
		}
	})
	if err := d.Start(context.Background()); err != nil {
		td.drained = true // Start tore down what it started
		return td, err
	}
	return td, nil
}

// stop drains the daemon now.
func (td *testDaemon) stop(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	td.Drain(ctx)
	td.drained = true
}
