package shaper

import (
	"errors"
	"sync"
	"time"
)

// Errors returned by Bucket.Admit. A lane in overflow mode "reject"
// dead-letters the message with the matching reason (SPEC §3).
var (
	// ErrBucketFull: the bucket holds capacity messages (reason "overflow").
	ErrBucketFull = errors.New("shaper: bucket full")
	// ErrMaxWait: the projected wait depth/rate exceeds bucket.max_wait
	// (reason "max_wait").
	ErrMaxWait = errors.New("shaper: projected wait exceeds max_wait")
)

// Bucket is the bounded FIFO of a lane: messages admitted and waiting for
// their departure, at most Capacity of them (SPEC G6). A source in overflow
// mode "block" first reserves free slots (Reserve) and fetches only that many
// messages, so admission never fails; in mode "reject" it admits without a
// reservation and the bucket refuses what does not fit.
//
// Bucket is safe for concurrent use. It does no I/O; Signal channels let a
// departure loop and a fetch loop wait for changes.
type Bucket struct {
	mu       sync.Mutex
	capacity int
	ring     []*Message
	head     int // index of the oldest message
	n        int // messages held
	reserved int // slots promised to a fetch in progress

	nonEmpty chan struct{} // gets a token when a message is admitted
	freed    chan struct{} // gets a token when a slot is freed
}

// NewBucket returns an empty bucket holding at most capacity messages
// (capacity ≥ 1; smaller values are raised to 1).
func NewBucket(capacity int) *Bucket {
	if capacity < 1 {
		capacity = 1
	}
	return &Bucket{
		capacity: capacity,
		ring:     make([]*Message, capacity),
		nonEmpty: make(chan struct{}, 1),
		freed:    make(chan struct{}, 1),
	}
}

// Capacity returns the configured capacity in messages.
func (b *Bucket) Capacity() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.capacity
}

// SetCapacity changes the capacity (hot reload). Messages held stay, in
// order, also when there are more of them than the new capacity: it only
// limits what is admitted from now on.
func (b *Bucket) SetCapacity(capacity int) {
	capacity = max(1, capacity)
	b.mu.Lock()
	defer b.mu.Unlock()
	size := max(capacity, b.n+b.reserved)
	ring := make([]*Message, size)
	for i := 0; i < b.n; i++ {
		ring[i] = b.ring[(b.head+i)%len(b.ring)]
	}
	b.ring, b.head, b.capacity = ring, 0, capacity
	notify(b.freed)
}

// Len returns the number of messages waiting (the bucket depth).
func (b *Bucket) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// Free returns the slots neither held nor reserved.
func (b *Bucket) Free() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.capacity - b.n - b.reserved
}

// Reserve promises up to max free slots to a fetch and returns how many it
// promised (0 when the bucket is full). Each admitted message with
// reserved=true consumes one; Release returns the unused ones.
func (b *Bucket) Reserve(max int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := min(max, b.capacity-b.n-b.reserved)
	if k < 0 {
		k = 0
	}
	b.reserved += k
	return k
}

// Release gives back k reserved slots that no message used.
func (b *Bucket) Release(k int) {
	if k <= 0 {
		return
	}
	b.mu.Lock()
	b.reserved = max(0, b.reserved-k)
	b.mu.Unlock()
	notify(b.freed)
}

// Admit appends m at the back, stamping m.Admitted = now. With reserved it
// uses a slot promised by Reserve and cannot fail. Without, it returns
// ErrBucketFull when no slot is free, or ErrMaxWait when maxWait > 0 and the
// projected wait — messages ahead divided by rate (messages per second) —
// exceeds it. It reports whether the bucket was empty before.
func (b *Bucket) Admit(m *Message, now time.Time, reserved bool, rate float64, maxWait time.Duration) (wasEmpty bool, err error) {
	b.mu.Lock()
	if reserved && b.reserved > 0 {
		b.reserved--
	} else {
		if b.n+b.reserved >= b.capacity {
			b.mu.Unlock()
			return false, ErrBucketFull
		}
		if maxWait > 0 {
			if rate <= 0 || time.Duration(float64(b.n)/rate*float64(time.Second)) > maxWait {
				b.mu.Unlock()
				return false, ErrMaxWait
			}
		}
	}
	m.Admitted = now
	b.ring[(b.head+b.n)%len(b.ring)] = m
	b.n++
	wasEmpty = b.n == 1
	b.mu.Unlock()
	notify(b.nonEmpty)
	return wasEmpty, nil
}

// Peek returns the oldest message without removing it, or nil.
func (b *Bucket) Peek() *Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == 0 {
		return nil
	}
	return b.ring[b.head]
}

// Pop removes and returns the oldest message, or nil when empty; it reports
// whether the bucket is empty afterwards.
func (b *Bucket) Pop() (m *Message, nowEmpty bool) {
	b.mu.Lock()
	if b.n == 0 {
		b.mu.Unlock()
		return nil, true
	}
	m = b.ring[b.head]
	b.ring[b.head] = nil
	b.head = (b.head + 1) % len(b.ring)
	b.n--
	nowEmpty = b.n == 0
	b.mu.Unlock()
	notify(b.freed)
	return m, nowEmpty
}

// RemoveIf removes every waiting message for which drop reports true,
// keeping the others in order, and returns the removed ones (oldest first)
// and whether the bucket is empty afterwards. drop runs under the bucket's
// lock: it must be quick and must not call the bucket.
func (b *Bucket) RemoveIf(drop func(*Message) bool) (removed []*Message, nowEmpty bool) {
	b.mu.Lock()
	kept := 0
	for i := 0; i < b.n; i++ {
		m := b.ring[(b.head+i)%len(b.ring)]
		if drop(m) {
			removed = append(removed, m)
			continue
		}
		b.ring[(b.head+kept)%len(b.ring)] = m
		kept++
	}
	for i := kept; i < b.n; i++ {
		b.ring[(b.head+i)%len(b.ring)] = nil
	}
	b.n = kept
	nowEmpty = b.n == 0
	b.mu.Unlock()
	if len(removed) > 0 {
		notify(b.freed)
	}
	return removed, nowEmpty
}

// DropHeadWhile removes messages from the head while drop reports true for
// them, and returns them (oldest first) and whether the bucket is empty
// afterwards. It stops at the first message drop keeps, so it costs what
// it removes, not the bucket's depth. drop runs under the bucket's lock.
func (b *Bucket) DropHeadWhile(drop func(*Message) bool) (removed []*Message, nowEmpty bool) {
	b.mu.Lock()
	for b.n > 0 && drop(b.ring[b.head]) {
		removed = append(removed, b.ring[b.head])
		b.ring[b.head] = nil
		b.head = (b.head + 1) % len(b.ring)
		b.n--
	}
	nowEmpty = b.n == 0
	b.mu.Unlock()
	if len(removed) > 0 {
		notify(b.freed)
	}
	return removed, nowEmpty
}

// Each calls fn for every waiting message, oldest first, under the bucket's
// lock: fn must be quick and must not call the bucket.
func (b *Bucket) Each(fn func(*Message)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := 0; i < b.n; i++ {
		fn(b.ring[(b.head+i)%len(b.ring)])
	}
}

// NonEmpty returns a channel that receives a token after an admission; a
// waiter must re-check Len after each token.
func (b *Bucket) NonEmpty() <-chan struct{} { return b.nonEmpty }

// Freed returns a channel that receives a token after a slot is freed.
func (b *Bucket) Freed() <-chan struct{} { return b.freed }

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
