package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources"
)

// The large-payload cell of section 5 (issue 15): 200 MiB of 512 KiB
// messages through one lane at 20/s. The bound: the benchmark process's
// peak RSS stays under capacity × message size + 64 MiB, with no
// slow-consumer error from nats.go (a pull larger than the subscription's
// pending limit, 64 MiB by default, loses messages in the client).
const (
	largeSize  = 512 << 10
	largeRate  = 20.0
	largeSlack = 64 << 20
)

// largeRow is the result of one large-payload cell (JSON: the cell runs in
// a child process of its own, see runLargeCell).
type largeRow struct {
	Msgs, Capacity int
	Budget         bool  // the lane joins a drain.MemoryBudget, as the daemon's lanes do
	Limit          int64 // the soft memory limit the budget set (bytes); 0: none
	Delivered      int
	Took           time.Duration
	BaseRSS        uint64 // VmRSS when the lane started
	PeakRSS        uint64 // VmHWM over the lane's run (reset before it), or the largest sampled VmRSS
	PeakHeap       uint64 // largest sampled HeapInuse
	GCs            uint32 // collections during the lane's run
	ServerHWM      uint64 // the nats-server child process's VmHWM over its life
	Slow           int64  // nats.ErrSlowConsumer reports on the lane's connection
	Disconnects    int64  // disconnections of the lane's connection (a server-side slow consumer closes it)
	Err            string
}

// bound is capacity × message size + 64 MiB.
func (r largeRow) bound() uint64 { return uint64(r.Capacity)*largeSize + largeSlack }

// holds reports whether the cell met the bound and lost nothing.
func (r largeRow) holds() bool {
	return r.Err == "" && r.PeakRSS > 0 && r.PeakRSS <= r.bound() && r.Slow == 0 && r.Disconnects == 0 && r.Delivered == r.Msgs
}

// largeCells are the cells of a run: capacity 20 (1 s of the rate) and
// capacity 300 (15 s, 150 MiB of payloads: more than one pull may bring,
// FetchBytes), each with the daemon's drain.MemoryBudget (it sets the Go
// runtime's soft memory limit from what the buckets may hold; under
// drain.MemoryEngage, as at capacity 20, it sets none); and capacity 300
// without it, Go's default GC, whose headroom (GOGC=100: the heap may grow
// by the live heap before a collection) is itself about capacity × message
// size. -quick runs the first cell with fewer messages.
func largeCells(msgs int, quick bool) []largeRow {
	cells := []largeRow{{Msgs: msgs, Capacity: 20, Budget: true}}
	if quick {
		return cells
	}
	return append(cells, largeRow{Msgs: msgs, Capacity: 300, Budget: true}, largeRow{Msgs: msgs, Capacity: 300})
}

// runLargeCell runs cell c in a child process of this benchmark binary
// (-large-child), so that the RSS measured is the cell's alone: not the
// embedded server of sections 3–5, nor what earlier sections left.
func runLargeCell(ctx context.Context, c largeRow) largeRow {
	exe, err := os.Executable()
	if err != nil {
		c.Err = err.Error()
		return c
	}
	arg, _ := json.Marshal(c)
	cmd := exec.CommandContext(ctx, exe, "-large-child", string(arg))
	for _, kv := range os.Environ() { // the budget steps aside for an operator's GOMEMLIMIT
		if !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		c.Err = fmt.Sprintf("%v: %s", err, stderr.String())
		return c
	}
	var r largeRow
	if err := json.Unmarshal(out, &r); err != nil {
		c.Err = fmt.Sprintf("child output %q: %v", out, err)
		return c
	}
	return r
}

// largeChild is -large-child: it runs the cell given as JSON and prints
// its result as JSON.
func largeChild(arg string, stdout io.Writer) int {
	var c largeRow
	if err := json.Unmarshal([]byte(arg), &c); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -large-child:", err)
		return 2
	}
	dir, err := os.MkdirTemp("", "shaper-bench-large-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := runLarge(ctx, dir, c)
	removeNATSBinary()
	b, _ := json.Marshal(r)
	fmt.Fprintln(stdout, string(b))
	return 0
}

// runLarge publishes msgs messages of largeSize bytes into a fresh stream
// on a nats-server child process (so that the RSS measured is shaper's and
// nats.go's, not the server's) and runs one lane of capacity c.Capacity
// at largeRate over them with a no-op sink, sampling the process's RSS.
func runLarge(ctx context.Context, dir string, c largeRow) largeRow {
	r, msgs := c, c.Msgs
	var slow, disc atomic.Int64
	env, err := startNATSProcess(dir, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrSlowConsumer) {
			slow.Add(1)
		}
	}), nats.DisconnectErrHandler(func(*nats.Conn, error) { disc.Add(1) }))
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer env.close()
	st := newStream("BIG", "big")
	if err := sources.EnsureStream(ctx, env.js, st.name, []string{st.filter()}); err != nil {
		r.Err = err.Error()
		return r
	}
	data := make([]byte, largeSize)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	for i := range msgs {
		m := &nats.Msg{Subject: st.subject, Data: data, Header: nats.Header{shaper.MsgIDHeader: {"big-" + strconv.Itoa(i)}}}
		if _, err := env.js.PublishMsg(ctx, m); err != nil {
			r.Err = fmt.Sprintf("publish %d: %v", i, err)
			return r
		}
	}
	st.n = msgs
	data = nil
	runtime.GC()
	debug.FreeOSMemory() // the publisher's buffers are not the lane's
	resetHWM := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	r.BaseRSS = procStatus(0, "VmRSS")
	slow.Store(0)
	disc.Store(0)
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)

	var mem *drain.MemoryBudget
	if c.Budget {
		mem = drain.NewMemoryBudget(nil) // as the daemon does with an external server
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sampled, heap uint64
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			sampled = max(sampled, procStatus(0, "VmRSS"))
			runtime.ReadMemStats(&ms)
			heap = max(heap, ms.HeapInuse)
			if l := mem.Limit(); l != math.MaxInt64 {
				r.Limit = max(r.Limit, l) // the lane leaves the budget when it ends
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	t0 := time.Now()
	cfg := laneConfig(st.name, st.filter(), env.consumerName("big"), largeRate, 0)
	cfg.Bucket.Capacity = c.Capacity
	res := env.runLaneNamed(ctx, st, cfg, "large payloads", drain.WithMemoryBudget(mem))
	r.Took = time.Since(t0)
	close(stop)
	wg.Wait()
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	r.GCs = ms1.NumGC - ms0.NumGC
	r.Delivered = res.n
	if res.err != nil {
		r.Err, r.Delivered = res.err.Error(), 0
		if c, err := env.js.Consumer(ctx, st.name, cfg.Source.Consumer); err == nil {
			i := c.CachedInfo()
			r.Err += fmt.Sprintf(" (consumer: %d ack pending, %d redelivered, %d waiting, delivered %d, ack floor %d)",
				i.NumAckPending, i.NumRedelivered, i.NumWaiting, i.Delivered.Stream, i.AckFloor.Stream)
		}
	}
	r.PeakRSS, r.PeakHeap = sampled, heap
	if resetHWM {
		r.PeakRSS = max(sampled, procStatus(0, "VmHWM"))
	}
	r.ServerHWM = procStatus(env.pid(), "VmHWM")
	r.Slow = slow.Load()
	r.Disconnects = disc.Load()
	return r
}

// runLaneNamed is runLane with a lane config of the caller's.
func (e *natsEnv) runLaneNamed(ctx context.Context, st *stream, cfg config.Lane, name string, opts ...drain.Option) endToEnd {
	src, err := sources.NewJetStream(ctx, e.js, sources.JetStreamConfig{
		Stream: cfg.Source.Stream, Subjects: cfg.Source.Subjects, Durable: cfg.Source.Consumer,
		AckWait: cfg.Source.AckWait, MaxAckPending: cfg.EffectiveMaxAckPending(),
	}, nil)
	if err != nil {
		return endToEnd{name: name, n: st.n, err: err}
	}
	r := runLaneOn(ctx, name, cfg, src, st.n, false, opts...)
	if r.err == nil {
		r.err = e.settled(ctx, st, cfg.Source.Consumer)
	}
	return r
}

func mib(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
