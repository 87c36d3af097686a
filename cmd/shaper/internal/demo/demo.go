// Package demo is `shaper demo` (SPEC §5): the main job on the seed
// scenario, self-contained. It starts the daemon with an embedded NATS
// server, a rigid downstream in a child process, publishes a flash-sale
// burst and a trickle, prints a per-second table and a summary judged at
// the downstream's kernel receive timestamps.
package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/daemon"
	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
)

// Options are the demo's flags.
type Options struct {
	Limit          float64       // the lane's rate, messages per second
	Burst          int           // messages published at once at the start
	TrickleRate    int           // messages per second published after the burst
	TrickleFor     time.Duration // how long the trickle lasts
	Timeout        time.Duration // give up waiting for deliveries after this
	Verbose        bool          // show the daemon's logs on stderr
	MaxInFlight    int           // task.max_in_flight
	BucketCapacity int           // bucket.capacity
}

// total is the number of messages the demo publishes.
func (o Options) total() int { return o.Burst + int(float64(o.TrickleRate)*o.TrickleFor.Seconds()) }

const (
	demoLane   = "payments"
	demoStream = "DEMO"
	demoConfig = `
nats:
  url: ""
  embedded: { listen: "127.0.0.1:0", store_dir: %q }
admin: { listen: "127.0.0.1:0" }
log: { level: info, format: text }
shutdown: { drain_timeout: 10s }
downstreams:
  payments:
    source: { stream: DEMO, subjects: [demo.payments.>], ack_wait: 60s, max_deliver: 5 }
    bucket: { capacity: %d, overflow: block }
    rate: { limit: %g }
    task: { timeout: 5s, max_in_flight: %d, retry: { backoff: [1s, 5s, 30s] } }
    sink: { kind: http, url: %q, method: POST, success_status: [2xx] }
`
)

// Run runs the demo and reports whether it passed: nothing lost, no
// request rejected by the downstream, the full rate under the backlog.
// An error means the demo could not run at all.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) (bool, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	dir, err := os.MkdirTemp("", "shaper-demo-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)

	down := newRigid(o.Limit)
	downURL, stopDown, err := startRigid(ctx, o.Limit, down)
	if err != nil {
		return false, fmt.Errorf("downstream: %w", err)
	}
	defer stopDown()

	cfg, err := writeConfig(dir, o, downURL)
	if err != nil {
		return false, err
	}
	logw := io.Discard
	if o.Verbose {
		logw = stderr
	}
	defer drain.StartGCFloor(nil).Stop() // as `shaper run` does (drain/memory.go)
	d := daemon.New(cfg, slog.New(slog.NewTextHandler(logw, nil)), io.Discard)
	if err := d.Start(ctx); err != nil {
		return false, err
	}
	drained := false
	defer func() {
		if !drained {
			d.Drain(context.Background())
		}
	}()
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		return false, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false, err
	}
	trickle := fmt.Sprintf(", then %d/s for %s", o.TrickleRate, o.TrickleFor)
	if o.TrickleRate <= 0 || o.TrickleFor <= 0 {
		trickle = ""
	}
	fmt.Fprintf(stdout, "shaper demo: %d messages at once%s, shaped to %g/s into a rigid downstream (429 if a request comes < %v after the previous one)\n\n",
		o.Burst, trickle, o.Limit, down.minGap.Round(time.Microsecond))
	pub := &publisher{js: js}
	start := time.Now()
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	go pub.run(pubCtx, o, start)
	if printTable(stdout, o, start, pub, down, d.Metrics().Lane(demoLane, o.Limit).BucketDepth) {
		// --timeout: give up now. A drain whose time is already up hands
		// what the lane holds back to the stream at once; it kept departing
		// for the drain timeout before, and the summary then counted
		// deliveries made after the timeout (a new-user pass).
		stopPub()
		up, cancel := context.WithCancel(context.Background())
		cancel()
		sum := d.Drain(up)
		drained = true
		return summarize(stdout, o, pub, down, nil, sum, true), nil
	}
	info := settle(ctx, js, cfg.Downstreams[demoLane].Source.Consumer)
	sum := d.Drain(context.Background())
	drained = true
	return summarize(stdout, o, pub, down, info, sum, false), nil
}

// writeConfig writes the demo's lane config into dir and loads it.
func writeConfig(dir string, o Options, downURL string) (*config.Config, error) {
	path := filepath.Join(dir, "demo.yaml")
	body := fmt.Sprintf(demoConfig, filepath.Join(dir, "nats"), o.BucketCapacity, o.Limit, o.MaxInFlight, downURL)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		return nil, err
	}
	cfg, _, err := config.Load(path, nil)
	return cfg, err
}

// settle waits up to 5 s for the acks to reach the server and returns the
// consumer's state (nil if it could not be read).
func settle(ctx context.Context, js jetstream.JetStream, consumer string) *jetstream.ConsumerInfo {
	var info *jetstream.ConsumerInfo
	for range 50 {
		c, err := js.Consumer(ctx, demoStream, consumer)
		if err == nil {
			info, err = c.Info(ctx)
		}
		if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return info
}
