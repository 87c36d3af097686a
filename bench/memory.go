package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources"
)

// memoryRow is one row of section 5.
type memoryRow struct {
	name     string
	n        int
	perMsg   float64 // heap bytes per queued message
	total    uint64  // heap bytes in all
	err      error
	fromJS   bool
	ringSize int // bytes of the bucket's ring of pointers
}

// heapAlloc returns HeapAlloc after two collections (the second one frees
// what the first one's finalizers released).
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// memorySynthetic fills a bucket of capacity n with shaper.Message values
// shaped like those sources.JetStream builds (a shared subject and stream
// name, one header packed with PackHeader, a payload of payloadSize bytes
// of its own, sequence, times), without the ack state sources.JetStream
// adds.
func memorySynthetic(n int) memoryRow {
	r := memoryRow{name: "shaper.Message as the source builds it, Acker nil", n: n, ringSize: 8 * n}
	before := heapAlloc()
	b := shaper.NewBucket(n)
	now := time.Now()
	for i := range n {
		data := make([]byte, payloadSize)
		data[0] = byte(i)
		m := &shaper.Message{
			Subject:      "bench.jobs",
			Data:         data,
			Stream:       "MEM",
			StreamSeq:    uint64(i + 1),
			NumDelivered: 1,
			Received:     now,
		}
		m.PackHeader(map[string][]string{shaper.MsgIDHeader: {"job-" + strconv.Itoa(i)}})
		if _, err := b.Admit(m, now, false, 0, 0); err != nil {
			r.err = err
			return r
		}
	}
	after := heapAlloc()
	runtime.KeepAlive(b)
	r.total = after - before
	r.perMsg = float64(after-before) / float64(n)
	return r
}

// memoryJetStream fills a bucket of capacity st.n with the messages of st,
// fetched through sources.JetStream exactly as a lane fetches them: what a
// full bucket really holds, including nats.go's message behind each Acker.
func (e *natsEnv) memoryJetStream(ctx context.Context, st *stream, name, profile string) memoryRow {
	r := memoryRow{name: name, n: st.n, fromJS: true, ringSize: 8 * st.n}
	consumer := e.consumerName("mem")
	defer func() { _ = e.js.DeleteConsumer(context.Background(), st.name, consumer) }()
	before := heapAlloc()
	src, err := sources.NewJetStream(ctx, e.js, sources.JetStreamConfig{
		Stream: st.name, Subjects: []string{st.filter()}, Durable: consumer,
		AckWait: config.DefaultAckWait, MaxAckPending: st.n + config.DefaultMaxInFlight,
	}, nil)
	if err != nil {
		r.err = err
		return r
	}
	b := shaper.NewBucket(st.n)
	deadline := time.Now().Add(time.Minute)
	for b.Len() < st.n {
		if time.Now().After(deadline) {
			r.err = fmt.Errorf("fetched %d of %d", b.Len(), st.n)
			return r
		}
		want := b.Reserve(st.n)
		got := 0
		err := src.Fetch(ctx, want, func(m *shaper.Message) {
			got++
			if _, err := b.Admit(m, time.Now(), true, 0, 0); err != nil && r.err == nil {
				r.err = err
			}
		})
		b.Release(want - got)
		if r.err != nil {
			return r
		}
		if err != nil && b.Len() < st.n {
			r.err = err
			return r
		}
	}
	after := heapAlloc()
	if profile != "" {
		if err := writeHeapProfile(profile); err != nil {
			r.err = err
		}
	}
	runtime.KeepAlive(b)
	runtime.KeepAlive(src)
	r.total = after - before
	r.perMsg = float64(after-before) / float64(st.n)
	return r
}

// runMemory measures section 5: the synthetic bucket; a bucket fed through
// sources.JetStream from a nats-server child process (what shaper and
// nats.go hold: the bound; with a heap profile written to profile
// when not empty, while that bucket is full); the same from env's embedded
// server, whose own state then counts too; and the large-payload cell.
func (res *Results) runMemory(ctx context.Context, env *natsEnv, profile string, logf func(string, ...any)) error {
	p := res.plan
	res.mem = append(res.mem, memorySynthetic(p.memMsgs))
	dir, err := os.MkdirTemp("", "shaper-bench-mem-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	defer removeNATSBinary()
	proc, err := startNATSProcess(dir)
	if err != nil {
		return fmt.Errorf("nats-server process: %w", err)
	}
	mem := newStream("MEM", "mem")
	err = proc.fill(ctx, mem, p.memJSMsgs)
	if err == nil {
		res.mem = append(res.mem, proc.memoryJetStream(ctx, mem, memRowChild, profile))
	}
	proc.close()
	if err != nil {
		return fmt.Errorf("fill stream: %w", err)
	}
	mem = newStream("MEM", "mem")
	if err := env.fill(ctx, mem, p.memJSMsgs); err != nil {
		return fmt.Errorf("fill stream: %w", err)
	}
	res.mem = append(res.mem, env.memoryJetStream(ctx, mem, memRowEmbedded, ""))
	for _, m := range res.mem {
		if m.err != nil {
			res.problems = append(res.problems, fmt.Sprintf("memory %s: %v", m.name, m.err))
		}
		logf("memory %-50s %.0f bytes/message", m.name, m.perMsg)
	}
	for _, c := range largeCells(p.largeMsgs, res.opts.Quick) {
		l := runLargeCell(ctx, c)
		res.large = append(res.large, l)
		if l.Err != "" {
			res.problems = append(res.problems, fmt.Sprintf("memory, large payloads, capacity %d: %s", l.Capacity, l.Err))
		}
		logf("memory, large payloads, capacity %d, %s: %d of %d delivered in %s, peak RSS %s MiB (bound %s; at start %s; peak heap in use %s; %d GCs; server HWM %s), %d slow-consumer errors",
			l.Capacity, l.limitWord(), l.Delivered, l.Msgs, l.Took.Round(time.Millisecond), mib(l.PeakRSS), mib(l.bound()), mib(l.BaseRSS), mib(l.PeakHeap), l.GCs, mib(l.ServerHWM), l.Slow)
	}
	return nil
}

// The names of section 5's JetStream rows.
const (
	memRowChild    = "fetched through sources.JetStream, nats-server a child process"
	memRowEmbedded = "the same, embedded nats-server (in this process)"
)

// runMemoryOnly is `-section memory`: section 5 alone against its own
// embedded NATS server, printed on stdout; with profile, every allocation
// is sampled (runtime.MemProfileRate = 1) and the heap profile is written
// there while the JetStream-fed bucket is full. Read it with
// `go tool pprof -sample_index=inuse_space -top FILE`.
func runMemoryOnly(quick bool, profile string, stdout, stderr io.Writer) int {
	if profile != "" {
		runtime.MemProfileRate = 1
	}
	res := &Results{opts: Options{Quick: quick, Progress: stderr}, plan: planFor(quick), started: time.Now()}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", a...) }
	dir, err := os.MkdirTemp("", "shaper-bench-")
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	env, err := startNATS(dir)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	defer env.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := res.runMemory(ctx, env, profile, logf); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	fmt.Fprint(stdout, res.memoryMarkdown())
	for _, h := range res.memoryHeadlines() {
		fmt.Fprintln(stdout, "- "+h)
	}
	for _, pr := range res.problems {
		fmt.Fprintln(stderr, "bench:", pr)
	}
	if len(res.problems) > 0 {
		return 1
	}
	return 0
}

// memBound is the bound on the heap of one queued message: its
// payload plus 512 bytes (issue 15).
const memBound = payloadSize + drain.MessageOverhead

func holdsWord(ok bool) string {
	if ok {
		return "holds"
	}
	return "does not hold"
}

// memoryMarkdown is section 5 of the report.
func (r *Results) memoryMarkdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("## 5. Memory of a full bucket\n\n")
	w("`runtime.MemStats.HeapAlloc` after two GCs, before and after filling a `shaper.NewBucket(n)` with `n`\n")
	w("messages of %d-byte payloads with one header (`Nats-Msg-Id`), per message; the bucket's own ring of\n", payloadSize)
	w("pointers is included. The bound (issue 15): payload + 512 = %d heap bytes per queued message. With the\n", memBound)
	w("nats-server a child process the heap is shaper's and nats.go's alone (nats.go's client-side buffers\n")
	w("count: the messages are fetched, not built); with the embedded server (the daemon's default) the server's\n")
	w("own per-message state (pending and delivered tracking, ~80 bytes per message in the heap profile) and its\n")
	w("block cache, which comes and goes, count too. What the bytes are: docs/performance.md.\n\n")
	mt := table{head: []string{"messages held", "n", "heap bytes/msg", "of which payload", "bound", "× bound", "bound holds", "total MiB"}}
	for _, m := range r.mem {
		mt.add(m.name, fmtInt(float64(m.n)), fmt.Sprintf("%.0f", m.perMsg), strconv.Itoa(payloadSize), strconv.Itoa(memBound),
			fmt.Sprintf("%.2f", m.perMsg/memBound), holdsWord(m.err == nil && m.perMsg <= memBound), fmt.Sprintf("%.1f", float64(m.total)/(1<<20)))
	}
	w("%s\n", mt.String())
	if len(r.large) == 0 {
		return b.String()
	}
	w("### Large payloads\n\n")
	w("%d messages of %d KiB (%s MiB) published into a stream on a nats-server child process, then one lane at\n",
		r.large[0].Msgs, largeSize>>10, mib(uint64(r.large[0].Msgs)*largeSize))
	w("%.0f/s (`sources.JetStream`, `drain.Lane`, no-op sink, max_in_flight %d) delivers them. Each cell runs in a\n", largeRate, config.DefaultMaxInFlight)
	w("process of its own (the benchmark binary again), so *peak RSS* is the lane's process alone: its VmHWM\n")
	w("over the lane's run (reset through /proc/self/clear_refs after publishing) or the largest VmRSS sampled\n")
	w("every 20 ms. The bound: capacity × message size + 64 MiB, no slow-consumer error (nats.go's\n")
	w("`ErrSlowConsumer`, counted by the connection's error handler) and no disconnection (nats-server closes a\n")
	w("client whose outbound buffer passes its max_pending, 64 MiB: its server-side slow consumer), every message\n")
	w("delivered. One pull brings at most `sources.FetchBytes` (16 MiB): before that bound, a capacity-300 lane\n")
	w("asked for 150 MiB at once, the server disconnected it twice and 97 messages waited for their ack wait.\n")
	w("*Server HWM* is the nats-server process's own peak, for scale (not in the bound). *memory limit*: the Go\n")
	w("runtime's soft memory limit that the daemon's `drain.MemoryBudget` set for the lane (Σ (capacity +\n")
	w("max_in_flight) × (largest payload + %d B) + %d MiB, from %d MiB of that share on), or none. Without it\n",
		drain.MessageOverhead, drain.MemoryHeadroom>>20, drain.MemoryEngage>>20)
	w("Go's GC lets the heap grow by the live heap (GOGC=100) before it collects, so past ~64 MiB of payloads the\n")
	w("headroom alone passes the bound: docs/performance.md.\n\n")
	lt := table{head: []string{"capacity", "memory limit", "delivered", "took s", "peak RSS MiB", "bound MiB", "× bound", "RSS at start MiB", "peak heap in use MiB", "GCs", "slow consumer", "disconnects", "server HWM MiB", "bound holds"}}
	for _, l := range r.large {
		lt.add(strconv.Itoa(l.Capacity), l.limitWord(), fmt.Sprintf("%d of %d", l.Delivered, l.Msgs), fmt.Sprintf("%.1f", l.Took.Seconds()),
			mib(l.PeakRSS), mib(l.bound()), fmt.Sprintf("%.2f", float64(l.PeakRSS)/float64(l.bound())), mib(l.BaseRSS), mib(l.PeakHeap),
			strconv.Itoa(int(l.GCs)), strconv.FormatInt(l.Slow, 10), strconv.FormatInt(l.Disconnects, 10), mib(l.ServerHWM), holdsWord(l.holds()))
	}
	w("%s\n", lt.String())
	return b.String()
}

// memoryHeadlines are section 5's lines of the headlines, computed from
// the rows.
func (r *Results) memoryHeadlines() []string {
	var hs []string
	for _, m := range r.mem {
		hs = append(hs, fmt.Sprintf("Memory, %s: %.0f heap bytes per queued %d-byte message, %.2f× the bound of payload + 512 (%s).",
			m.name, m.perMsg, payloadSize, m.perMsg/memBound, holdsWord(m.err == nil && m.perMsg <= memBound)))
	}
	for _, l := range r.large {
		lim := ", " + l.limitWord()
		hs = append(hs, fmt.Sprintf("Large payloads, %d × %d KiB at %.0f/s, capacity %d%s: peak RSS %s MiB against capacity × size + 64 MiB = %s MiB (%.2f×), %d slow-consumer errors, %d disconnects, %d of %d delivered: the bound %s.",
			l.Msgs, largeSize>>10, largeRate, l.Capacity, lim, mib(l.PeakRSS), mib(l.bound()), float64(l.PeakRSS)/float64(l.bound()), l.Slow, l.Disconnects, l.Delivered, l.Msgs, holdsWord(l.holds())))
	}
	return hs
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// limitWord says which soft memory limit a large-payload cell ran under.
func (l largeRow) limitWord() string {
	switch {
	case !l.Budget:
		return "no memory budget (Go's default GC)"
	case l.Limit == 0:
		return fmt.Sprintf("memory budget, no limit set (share under %d MiB)", drain.MemoryEngage>>20)
	default:
		return "memory budget, limit " + mib(uint64(l.Limit)) + " MiB"
	}
}
