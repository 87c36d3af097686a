package drain

import (
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// The soft memory limit from what the buckets may hold (issue 15: large
// payloads).
//
// A lane holds at most capacity + max_in_flight messages: those in its
// bucket, those in flight, and those a pull brought that wait for a slot (a
// pull asks for free slots only). Go's collector by default (GOGC=100) lets
// the heap grow by the live heap before it collects, so a bucket of large
// payloads leaves as much again in departed payloads before a collection
// comes: 300 messages of 512 KiB (150 MiB) peaked at 229–232 MiB of RSS,
// over the bound of capacity × size + 64 MiB (docs/performance.md).
// The runtime's soft memory limit (runtime/debug.SetMemoryLimit, what the
// GOMEMLIMIT variable sets) makes the collector run before the heap passes
// the limit instead. A MemoryBudget keeps that limit at
//
//	Σ over lanes (capacity + max_in_flight) × (largest payload seen + MessageOverhead) + MemoryHeadroom
//
// and moves it when a lane meets a larger payload than before, is
// reconfigured, or ends. While the lanes' share is under MemoryEngage it
// sets no limit: small messages cost less than Go's default headroom gives,
// and a tight limit over a heap of other things would make the collector run
// more often for nothing.

// MessageOverhead is what a queued message costs besides its payload, in
// bytes: the bound per queued message (payload + 512 B; 619 B in
// all for a 256-byte payload fetched from JetStream, docs/BENCHMARKS.md §5).
const MessageOverhead = 512

// MemoryHeadroom is the part of the limit for everything but the queued
// messages, in bytes: the rest of the heap, goroutine stacks and the
// runtime's own structures. RSS holds ~10–20 MiB more that the limit does
// not count (the binary), so that capacity × size + 64 MiB of RSS holds.
const MemoryHeadroom = 40 << 20

// MemoryEngage is the lanes' share (Σ of the first term above, bytes) from
// which a MemoryBudget sets a limit.
const MemoryEngage = 64 << 20

// MemoryBudget sets the Go runtime's soft memory limit from what the lanes
// that share it may hold (see above). One per process; lanes join it with
// WithMemoryBudget. A nil *MemoryBudget does nothing.
type MemoryBudget struct {
	mu    sync.Mutex
	lanes map[*Lane]struct{}
	limit int64             // the limit last set; math.MaxInt64: none
	set   func(int64) int64 // debug.SetMemoryLimit
	log   *slog.Logger
}

// NewMemoryBudget returns the process's budget, or nil when the GOMEMLIMIT
// environment variable is set: an operator's limit (or "off") is kept as
// given. log receives a line when the limit changes (nil: none).
func NewMemoryBudget(log *slog.Logger) *MemoryBudget {
	if os.Getenv("GOMEMLIMIT") != "" {
		return nil
	}
	return newMemoryBudget(debug.SetMemoryLimit, log)
}

func newMemoryBudget(set func(int64) int64, log *slog.Logger) *MemoryBudget {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &MemoryBudget{lanes: map[*Lane]struct{}{}, limit: math.MaxInt64, set: set, log: log}
}

// WithMemoryBudget makes the lane count in b (nil: no budget).
func WithMemoryBudget(b *MemoryBudget) Option {
	return optionFunc(func(l *Lane) { l.mem = b })
}

// Limit returns the limit b set in bytes, or math.MaxInt64 when it set none.
func (b *MemoryBudget) Limit() int64 {
	if b == nil {
		return math.MaxInt64
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limit
}

// join adds l and sets the limit again.
func (b *MemoryBudget) join(l *Lane) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lanes[l] = struct{}{}
	b.setLocked()
}

// leave removes l (its bucket is empty: the lane ended) and sets the limit
// again.
func (b *MemoryBudget) leave(l *Lane) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.lanes, l)
	b.setLocked()
}

// update sets the limit from the lanes' configurations and the largest
// payloads they have seen.
func (b *MemoryBudget) update() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setLocked()
}

// setLocked is update with b.mu held.
func (b *MemoryBudget) setLocked() {
	var share int64
	for l := range b.lanes {
		cfg := l.conf()
		share += int64(cfg.Bucket.Capacity+cfg.Task.MaxInFlight) * (l.maxPayload.Load() + MessageOverhead)
	}
	want := int64(math.MaxInt64)
	if share >= MemoryEngage {
		want = share + MemoryHeadroom
	}
	if want == b.limit {
		return
	}
	b.set(want)
	// Every change is logged: they are rare (a lane's largest payload so
	// far grows, a reload, a lane's end); limit_bytes -1 means none.
	logged := want
	if want == math.MaxInt64 {
		logged = -1
	}
	b.log.Info("memory limit from what the buckets may hold", "limit_bytes", logged, "lanes_share_bytes", share, "lanes", len(b.lanes))
	b.limit = want
}

// notePayload records the size of a fetched message's payload (bytes) and
// raises the limit when it is the largest the lane has seen: one atomic
// load per message otherwise.
func (l *Lane) notePayload(n int) {
	for {
		seen := l.maxPayload.Load()
		if int64(n) <= seen {
			return
		}
		if l.maxPayload.CompareAndSwap(seen, int64(n)) {
			break
		}
	}
	l.mem.update()
}

// The GC floor (issue 15: CPU per message, HTTP at 5,000/s).
//
// A lane's live heap is small (a few MiB for a bucket of 1,000 small
// messages), and each departure allocates a little: a message, its headers,
// a request. With Go's default GOGC=100 the heap may grow only by the live
// heap before the next collection, so a process with 4 MiB live collects
// every 4 MiB allocated: at 5,000/s through the HTTP sink, ~90 collections
// in 10 s, against ~16 with the floor (gctrace, bench section 11). That
// saves the lane a little CPU (171 against 177 µs per request, 6 alternated
// pairs); it is not what keeps the lane under 5,000/s on 2 cores
// (docs/performance.md, "The GC floor").
//
// A GCFloorTuner keeps the heap goal at no less than GCFloor. Go's
// collector sets the goal of the next cycle at
//
//	live + (live + stacks + globals) × GOGC / 100
//
// (the heap the last cycle marked, plus GOGC percent of it and of the
// stacks and globals it scanned: the runtime's pacer since Go 1.18), and at
// no less than the heap minimum, 4 MiB × GOGC / 100. After each collection
// the tuner reads the three (runtime/metrics /gc/heap/live:bytes,
// /gc/scan/stack:bytes, /gc/scan/globals:bytes) and sets GOGC
// (runtime/debug.SetGCPercent) to
//
//	max(100, min(100 × (GCFloor − live) / (live + stacks + globals), 100 × GCFloor / 4 MiB))
//
// so the goal is GCFloor while the live heap is small and Go's default above
// that: a large heap (a bucket of large payloads) is collected exactly as
// without the floor, and the soft memory limit a MemoryBudget sets still
// caps the goal. What it costs is at most GCFloor of heap, most of it
// garbage, in a daemon that would otherwise hold a few MiB. (A first version
// had neither the stacks and globals nor the heap minimum: for a small live
// heap it set GOGC up to 12,800, which makes the heap minimum 512 MiB. The
// bench's large-payload cell, capacity 20, then peaked at 99.7 MiB of heap
// and 120.7 MiB of RSS against its bound of 74 MiB; TestGCFloorEachCycle
// now reads the runtime's own goal.)

// GCFloor is the heap goal a GCFloorTuner keeps at the least, in bytes.
const GCFloor = 32 << 20

// runtimeHeapMinimum is the Go runtime's heap minimum at GOGC=100, in
// bytes (defaultHeapMinimum in runtime/mgcpacer.go): the goal is never under
// it × GOGC / 100.
const runtimeHeapMinimum = 4 << 20

// gcPercentMax caps the GOGC a GCFloorTuner sets: the GOGC whose heap
// minimum is GCFloor (800), what a process with a tiny heap gets; more
// would put the goal past the floor.
const gcPercentMax = 100 * GCFloor / runtimeHeapMinimum

// gcCycleStats is what the last collection measured, in bytes: the heap it
// marked, and the stacks and globals it scanned.
type gcCycleStats struct{ live, stacks, globals int64 }

// floorPercent returns the GOGC that makes the heap goal, live + (live +
// stacks + globals) × GOGC / 100, at least GCFloor: Go's default 100 when
// that already reaches it, else 100 × (GCFloor − live) / (live + stacks +
// globals) rounded up, at most gcPercentMax.
func floorPercent(c gcCycleStats) int {
	base := c.live + c.stacks + c.globals
	if base <= 0 {
		return gcPercentMax
	}
	if c.live+base >= GCFloor {
		return 100
	}
	p := (100*(GCFloor-c.live) + base - 1) / base
	return int(min(max(p, 100), gcPercentMax))
}

// GCFloorTuner keeps the Go collector's heap goal at no less than GCFloor
// (see above). One per process; StartGCFloor starts it. A nil
// *GCFloorTuner does nothing.
type GCFloorTuner struct {
	stats   func() gcCycleStats // what the last collection measured
	set     func(int) int       // debug.SetGCPercent
	mu      sync.Mutex
	percent int // the GOGC last set; 0: none yet
	before  int // the GOGC before the first set, restored by Stop
	stopped bool
	process bool // from StartGCFloor: Stop clears floorRunning
}

// floorRunning is set while a GCFloorTuner from StartGCFloor runs: GOGC is
// the process's, so there is one.
var floorRunning atomic.Bool

// StartGCFloor starts the process's GC floor and returns it, or nil when
// the GOGC environment variable is set (an operator's GOGC, or "off", is
// kept as given) or one already runs. It sets GOGC at once from the last
// collection, then again after every collection (a finalizer that runs once
// per cycle: nothing wakes while the process allocates nothing). log
// receives one line at the start (nil: none).
func StartGCFloor(log *slog.Logger) *GCFloorTuner {
	if os.Getenv("GOGC") != "" || !floorRunning.CompareAndSwap(false, true) {
		return nil
	}
	t := newGCFloor(lastCycle, debug.SetGCPercent)
	t.process = true
	t.tune()
	t.arm()
	if log != nil {
		log.Info("gc floor: the heap goal is kept at no less than the floor", "floor_bytes", int64(GCFloor), "gogc", t.Percent())
	}
	return t
}

func newGCFloor(stats func() gcCycleStats, set func(int) int) *GCFloorTuner {
	return &GCFloorTuner{stats: stats, set: set}
}

// lastCycle reads what the last collection measured from runtime/metrics.
func lastCycle() gcCycleStats {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
	metrics.Read(s)
	v := func(i int) int64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(s[i].Value.Uint64())
	}
	return gcCycleStats{live: v(0), stacks: v(1), globals: v(2)}
}

// Percent returns the GOGC t set last (0 before the first, or for nil).
func (t *GCFloorTuner) Percent() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.percent
}

// Stop ends the floor and restores the GOGC that was in force before it.
func (t *GCFloorTuner) Stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	if t.percent != 0 {
		t.set(t.before)
	}
	if t.process {
		floorRunning.Store(false)
	}
}

// tune sets GOGC from the live heap, when it differs from the last set.
// It reports false once t is stopped.
func (t *GCFloorTuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	p := floorPercent(t.stats())
	if p == t.percent {
		return true
	}
	old := t.set(p)
	if t.percent == 0 {
		t.before = old
	}
	t.percent = p
	return true
}

// gcCycle is the object whose finalizer tunes t once per collection: it is
// unreachable from the start, so each cycle finds it, queues its finalizer
// and keeps it for that; the finalizer sets itself again for the next one.
type gcCycle struct{ t *GCFloorTuner }

func (t *GCFloorTuner) arm() {
	runtime.SetFinalizer(&gcCycle{t: t}, (*gcCycle).ran)
}

func (c *gcCycle) ran() {
	if c.t.tune() {
		runtime.SetFinalizer(c, (*gcCycle).ran)
	}
}
