package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/cobra"

	"github.com/shaper-dev/shaper/config"
)

// rigid is the demo's downstream (SPEC §5): it answers 429 to any request
// that arrives sooner than 1/(1.1 × limit) after the previously accepted one,
// the 10 % margin an operator leaves for network jitter. It runs in a child
// process (`shaper demo-downstream`), as a real downstream would: in the same
// process it would share the Go scheduler with the lane and the embedded NATS
// server, and its handler goroutines would be woken milliseconds late, which
// measures our scheduler instead of the pacer. The child reports every
// request on its stdout; the parent keeps the record here.
type rigid struct {
	minGap time.Duration

	mu       sync.Mutex
	accepted map[string]int // key -> accepted count
	rejected int
	events   []rigidEvent
}

type rigidEvent struct {
	at       time.Time
	accepted bool
	wait     time.Duration // publish -> arrival
}

func rigidGap(limit float64) time.Duration {
	return time.Duration(float64(time.Second) / (1.1 * limit))
}

func newRigid(limit float64) *rigid {
	return &rigid{minGap: rigidGap(limit), accepted: map[string]int{}}
}

// record adds one request reported by the child.
func (r *rigid) record(at time.Time, ok bool, key string, published time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		r.accepted[key]++
	} else {
		r.rejected++
	}
	r.events = append(r.events, rigidEvent{at: at, accepted: ok, wait: at.Sub(published)})
}

// startRigid starts the downstream child process and feeds r from its
// reports. It returns the downstream's URL and a stop function.
func startRigid(ctx context.Context, limit float64, r *rigid) (string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "demo-downstream", "--limit", strconv.FormatFloat(limit, 'g', -1, 64))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // the child exits when this closes
	if err != nil {
		return "", nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return "", nil, fmt.Errorf("downstream child did not start")
	}
	addr, _ := strings.CutPrefix(sc.Text(), "listening ")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 4 {
				continue
			}
			at, _ := strconv.ParseInt(f[0], 10, 64)
			pub, _ := strconv.ParseInt(f[3], 10, 64)
			r.record(time.Unix(0, at), f[1] == "1", f[2], time.Unix(0, pub))
		}
	}()
	stop := func() {
		_ = stdin.Close()
		<-done
		_ = cmd.Wait()
	}
	return "http://" + addr + "/callback", stop, nil
}

// demoDownstreamCmd is the child process of the demo: the rigid downstream.
func demoDownstreamCmd(stdout io.Writer) *cobra.Command {
	var limit float64
	cmd := &cobra.Command{
		Use:    "demo-downstream",
		Short:  "The demo's rigid downstream (started by shaper demo)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			ln, err := listenTimestamped("127.0.0.1:0")
			if err != nil {
				return err
			}
			var mu sync.Mutex
			w := bufio.NewWriter(stdout)
			fmt.Fprintf(w, "listening %s\n", ln.Addr())
			w.Flush()
			srv := &rigidServer{minGap: rigidGap(limit), report: func(at time.Time, ok bool, key string, published int64) {
				flag := "0"
				if ok {
					flag = "1"
				}
				mu.Lock()
				fmt.Fprintf(w, "%d %s %s %d\n", at.UnixNano(), flag, strings.ReplaceAll(key, " ", "_"), published)
				w.Flush()
				mu.Unlock()
			}}
			go srv.serve(ln)
			defer ln.Close()
			_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
			return nil
		},
	}
	cmd.Flags().Float64Var(&limit, "limit", 100, "the lane's rate; requests closer than 1/(1.1 × limit) get 429")
	return cmd
}

type demoOptions struct {
	limit          float64
	burst          int
	trickleRate    int
	trickleFor     time.Duration
	timeout        time.Duration
	verbose        bool
	maxInFlight    int
	bucketCapacity int
}

func demoCmd(stdout, stderr io.Writer) *cobra.Command {
	o := demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Shape a flash-sale burst into a rigid downstream, self-contained",
		Long: `demo starts an embedded NATS server, a built-in rigid HTTP downstream (it answers
429 to any request sooner than 1/(1.1 × limit) after the previous accepted one) and
one lane; publishes a flash-sale burst followed by a trickle; prints a per-second
table and a summary. It exits 1 if any message was lost or rejected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case !(o.limit > 0) || o.limit > 10000:
				return &exitError{code: exitUsage, err: fmt.Errorf("demo: --limit must be in (0, 10000], got %g", o.limit)}
			case o.burst < 0 || o.trickleRate < 0 || o.trickleFor < 0:
				return &exitError{code: exitUsage, err: errors.New("demo: --burst, --trickle-rate and --trickle-for must be ≥ 0")}
			case o.burst+o.trickleRate == 0:
				return &exitError{code: exitUsage, err: errors.New("demo: nothing to publish (--burst and --trickle-rate are 0)")}
			case o.bucketCapacity < 1 || o.maxInFlight < 1 || o.timeout <= 0:
				return &exitError{code: exitUsage, err: errors.New("demo: --capacity, --max-in-flight and --timeout must be positive")}
			}
			ok, err := runDemo(cmd.Context(), o, stdout, stderr)
			if err != nil {
				return &exitError{code: exitFailure, err: fmt.Errorf("demo: %w", err)}
			}
			if !ok {
				return &exitError{code: exitFailure}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.Float64Var(&o.limit, "limit", 100, "lane rate, messages per second")
	f.IntVar(&o.burst, "burst", 1000, "messages published at once at the start (the flash sale)")
	f.IntVar(&o.trickleRate, "trickle-rate", 20, "messages per second published after the burst")
	f.DurationVar(&o.trickleFor, "trickle-for", 10*time.Second, "how long the trickle lasts")
	f.DurationVar(&o.timeout, "timeout", 50*time.Second, "give up waiting for deliveries after this")
	f.IntVar(&o.maxInFlight, "max-in-flight", 8, "task.max_in_flight of the lane")
	f.IntVar(&o.bucketCapacity, "capacity", 1000, "bucket.capacity of the lane")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "show the daemon's logs")
	return cmd
}

const demoConfig = `
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

func runDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer) (bool, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	dir, err := os.MkdirTemp("", "shaper-demo-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)

	down := newRigid(o.limit)
	downURL, stopDown, err := startRigid(ctx, o.limit, down)
	if err != nil {
		return false, fmt.Errorf("downstream: %w", err)
	}
	defer stopDown()

	path := filepath.Join(dir, "demo.yaml")
	body := fmt.Sprintf(demoConfig, filepath.Join(dir, "nats"), o.bucketCapacity, o.limit, o.maxInFlight, downURL)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		return false, err
	}
	cfg, _, err := config.Load(path, nil)
	if err != nil {
		return false, err
	}
	logw := io.Discard
	if o.verbose {
		logw = stderr
	}
	log := newLogger(logw, "info", "text")
	d := newDaemon(cfg, log)
	if err := d.start(ctx); err != nil {
		return false, err
	}
	drained := false
	defer func() {
		if !drained {
			d.drain(context.Background())
		}
	}()

	nc, err := nats.Connect(d.natsURL())
	if err != nil {
		return false, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false, err
	}
	total := o.burst + int(float64(o.trickleRate)*o.trickleFor.Seconds())
	fmt.Fprintf(stdout, "shaper demo: %d messages at once, then %d/s for %s, shaped to %g/s into a rigid downstream (429 if a request comes < %v after the previous one)\n\n",
		o.burst, o.trickleRate, o.trickleFor, o.limit, down.minGap.Round(time.Microsecond))

	var (
		pubMu     sync.Mutex
		published []time.Time
		pubErr    error
	)
	publish := func(i int) {
		now := time.Now()
		data, _ := json.Marshal(map[string]any{"id": i, "published_unix_nano": now.UnixNano()})
		msg := &nats.Msg{Subject: fmt.Sprintf("demo.payments.%d", i), Data: data, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("order-%06d", i))
		_, err := js.PublishMsg(ctx, msg)
		pubMu.Lock()
		if err != nil && pubErr == nil {
			pubErr = err
		}
		published = append(published, now)
		pubMu.Unlock()
	}
	start := time.Now()
	go func() {
		// The flash sale: the burst as fast as the server takes it.
		futures := make([]jetstream.PubAckFuture, 0, o.burst)
		for i := 0; i < o.burst; i++ {
			data, _ := json.Marshal(map[string]any{"id": i, "published_unix_nano": time.Now().UnixNano()})
			msg := &nats.Msg{Subject: fmt.Sprintf("demo.payments.%d", i), Data: data, Header: nats.Header{}}
			msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("order-%06d", i))
			f, err := js.PublishMsgAsync(msg)
			pubMu.Lock()
			if err != nil && pubErr == nil {
				pubErr = err
			}
			published = append(published, time.Now())
			pubMu.Unlock()
			if err == nil {
				futures = append(futures, f)
			}
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				pubMu.Lock()
				if pubErr == nil {
					pubErr = err
				}
				pubMu.Unlock()
			}
		}
		// Then the trickle.
		if o.trickleRate > 0 {
			every := time.Second / time.Duration(o.trickleRate)
			n := int(float64(o.trickleRate) * o.trickleFor.Seconds())
			for i := 0; i < n; i++ {
				time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
				publish(o.burst + i)
			}
		}
	}()

	lane := d.m.Lane("payments", float64(o.limit))
	gauge := func(g prometheus.Gauge) float64 {
		var m dto.Metric
		_ = g.Write(&m)
		return m.GetGauge().GetValue()
	}
	fmt.Fprintf(stdout, "%6s %8s %9s %7s %6s %14s\n", "second", "arrived", "departed", "bucket", "429s", "p99 queue wait")
	deadline := start.Add(o.timeout)
	sec := 0
	var rows int
	for {
		sec++
		time.Sleep(time.Until(start.Add(time.Duration(sec) * time.Second)))
		from, to := start.Add(time.Duration(sec-1)*time.Second), start.Add(time.Duration(sec)*time.Second)
		pubMu.Lock()
		arrived := countIn(published, from, to)
		nPub := len(published)
		pubMu.Unlock()
		down.mu.Lock()
		var departed, rejected int
		var waits []time.Duration
		for _, e := range down.events {
			if !e.at.Before(from) && e.at.Before(to) {
				departed++
				if !e.accepted {
					rejected++
				}
				waits = append(waits, e.wait)
			}
		}
		unique := len(down.accepted)
		down.mu.Unlock()
		fmt.Fprintf(stdout, "%6d %8d %9d %7.0f %6d %14s\n", sec, arrived, departed, gauge(lane.BucketDepth), rejected, p99(waits))
		rows++
		if unique >= total && nPub >= total {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(stdout, "timed out after %s\n", o.timeout)
			break
		}
	}

	// Settle: wait for the acks to reach the server, then inspect the consumer.
	var info *jetstream.ConsumerInfo
	for i := 0; i < 50; i++ {
		c, err := js.Consumer(ctx, "DEMO", cfg.Downstreams["payments"].Source.Consumer)
		if err == nil {
			info, err = c.Info(ctx)
		}
		if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sum := d.drain(context.Background())
	drained = true

	down.mu.Lock()
	defer down.mu.Unlock()
	dups, missing := 0, 0
	for i := 0; i < total; i++ {
		switch n := down.accepted[fmt.Sprintf("order-%06d", i)]; {
		case n == 0:
			missing++
		case n > 1:
			dups += n - 1
		}
	}
	var allWaits []time.Duration
	for _, e := range down.events {
		allWaits = append(allWaits, e.wait)
	}
	// Reports come in processing order; gaps are between arrivals in time.
	var arrivals []time.Time
	for _, e := range down.events {
		arrivals = append(arrivals, e.at)
	}
	sort.Slice(arrivals, func(i, j int) bool { return arrivals[i].Before(arrivals[j]) })
	minGap := time.Duration(0)
	for i := 1; i < len(arrivals); i++ {
		if g := arrivals[i].Sub(arrivals[i-1]); i == 1 || g < minGap {
			minGap = g
		}
	}
	// The delivery rate over the downstream's busy span: first to last
	// accepted request.
	var span time.Duration
	var first, last time.Time
	for _, e := range down.events {
		if e.accepted {
			if first.IsZero() {
				first = e.at
			}
			last = e.at
		}
	}
	span = last.Sub(first)
	perSec := 0.0
	if span > 0 {
		perSec = float64(len(down.accepted)-1) / span.Seconds()
	}
	busyN, busyDur := busySpan(published, down.events)
	busyRate := 0.0
	if busyDur > 0 {
		busyRate = float64(busyN-1) / busyDur.Seconds()
	}
	fmt.Fprintf(stdout, "\nsummary: published %d, delivered %d distinct in %.2fs (%.1f/s), downstream 429s %d, duplicates %d, missing %d\n",
		total, len(down.accepted), span.Seconds(), perSec, down.rejected, dups, missing)
	fmt.Fprintf(stdout, "         delivered rate while a backlog waited: %.2f/s over %.2fs (%d requests), %.2f %% of the limit %g/s\n",
		busyRate, busyDur.Seconds(), busyN, 100*busyRate/o.limit, o.limit)
	fmt.Fprintf(stdout, "         smallest gap seen by the downstream %v (it rejects below %v); p99 queue wait %s\n",
		minGap.Round(time.Microsecond), down.minGap.Round(time.Microsecond), p99(allWaits))
	if info != nil {
		fmt.Fprintf(stdout, "         consumer: %d pending, %d unacknowledged, %d redelivered; drain: %d delivered, %d handed back\n",
			info.NumPending, info.NumAckPending, info.NumRedelivered, sum.Delivered, sum.Nacked)
	}
	// SPEC G1: the full rate under a backlog (within 0.5 %), judged only
	// over a busy span long enough to mean it (≥ 2 s).
	short := busyDur >= 2*time.Second && busyRate < demoMinRateShare*o.limit
	ok := pubErr == nil && missing == 0 && down.rejected == 0 && info != nil && info.NumAckPending == 0 && info.NumPending == 0 && !short
	if pubErr != nil {
		fmt.Fprintf(stdout, "publish error: %v\n", pubErr)
	}
	if ok {
		fmt.Fprintln(stdout, "result: OK — nothing lost, no request rejected by the downstream")
	} else {
		var why []string
		if missing > 0 {
			why = append(why, fmt.Sprintf("%d not delivered before --timeout (handed back to the stream, not lost; raise --timeout)", missing))
		}
		if down.rejected > 0 {
			why = append(why, fmt.Sprintf("the downstream rejected %d requests (429)", down.rejected))
		}
		if pubErr != nil {
			why = append(why, "a publish failed")
		}
		if short {
			why = append(why, fmt.Sprintf("the downstream saw %.2f/s under a backlog, below %.1f %% of the limit %g/s",
				busyRate, 100*demoMinRateShare, o.limit))
		}
		if info == nil || info.NumAckPending != 0 || info.NumPending != 0 {
			why = append(why, "the consumer still had messages pending when the demo stopped")
		}
		fmt.Fprintf(stdout, "result: FAILED — %s\n", strings.Join(why, "; "))
	}
	return ok, nil
}

// demoMinRateShare is the share of the limit the downstream must see while a
// backlog waits (SPEC G1: the long-run rate within 0.5 %).
const demoMinRateShare = 0.995

// busySpan returns the accepted requests of the first busy span — from the
// first accepted request up to the last one that left while another message
// had already been published and was waiting — and the span's length,
// judged at the downstream's timestamps.
func busySpan(published []time.Time, events []rigidEvent) (int, time.Duration) {
	var acc []time.Time
	for _, e := range events {
		if e.accepted {
			acc = append(acc, e.at)
		}
	}
	sort.Slice(acc, func(i, j int) bool { return acc[i].Before(acc[j]) })
	pub := append([]time.Time(nil), published...)
	sort.Slice(pub, func(i, j int) bool { return pub[i].Before(pub[j]) })
	n, p := 0, 0
	for i, a := range acc {
		for p < len(pub) && !pub[p].After(a) {
			p++
		}
		n = i + 1
		if p <= i+1 { // nothing else waited when this one left
			break
		}
	}
	if n < 2 {
		return n, 0
	}
	return n, acc[n-1].Sub(acc[0])
}

func countIn(ts []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range ts {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

func p99(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	v := s[min(len(s)-1, int(float64(len(s))*0.99))]
	return v.Round(time.Millisecond).String()
}
