package drain

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"sync"
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
