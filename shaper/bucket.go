package shaper

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Errors returned by Bucket.Admit. A lane in overflow mode "reject"
// dead-letters the message with the matching reason (SPEC §3).
var (
	// ErrBucketFull: the bucket holds capacity messages (reason "overflow").
	ErrBucketFull = errors.New("shaper: bucket full")
	// ErrFairShare: with fair queueing, the message's key already holds its
	// fair share of the capacity while other keys wait (reason "overflow";
	// errors.Is(err, ErrBucketFull) is true).
	ErrFairShare = fmt.Errorf("%w: key holds its fair share", ErrBucketFull)
	// ErrMaxWait: the projected wait depth/rate exceeds bucket.max_wait
	// (reason "max_wait").
	ErrMaxWait = errors.New("shaper: projected wait exceeds max_wait")
)

// Bucket is the bounded queue of a lane: messages admitted and waiting for
// their departure, at most Capacity of them (SPEC G6). A source in overflow
// mode "block" first reserves free slots (Reserve) and fetches only that many
// messages, so admission never fails; in mode "reject" it admits without a
// reservation and the bucket refuses what does not fit.
//
// Without a key function (NewBucket) the bucket is one FIFO. With one
// (NewFairBucket, bucket.fair_key) it holds one FIFO per key and serves the
// keys by deficit round robin (fair.go): order is kept within a key, the
// capacity is the lane's, and "head" — Peek, Pop, DropHeadWhile — is the
// next message to depart.
//
// Bucket is safe for concurrent use. It does no I/O; Signal channels let a
// departure loop and a fetch loop wait for changes.
type Bucket struct {
	mu       sync.Mutex
	capacity int
	keyOf    func(*Message) string // nil: one FIFO (every message has key "")
	fq       fairQueue
	reserved int // slots promised to a fetch in progress

	nonEmpty chan struct{} // gets a token when a message is admitted
	freed    chan struct{} // gets a token when a slot is freed (see freedAt)
	freedAt  int           // a removal signals freed only from this many free slots on
}

// NewBucket returns an empty FIFO bucket holding at most capacity messages
// (capacity ≥ 1; smaller values are raised to 1).
func NewBucket(capacity int) *Bucket { return NewFairBucket(capacity, nil) }

// NewFairBucket returns an empty bucket of capacity messages that serves the
// keys keyOf gives by round robin (see FairKeyFunc); a nil keyOf is one FIFO,
// as NewBucket.
func NewFairBucket(capacity int, keyOf func(*Message) string) *Bucket {
	return &Bucket{
		capacity: max(1, capacity),
		keyOf:    keyOf,
		fq:       newFairQueue(keyOf != nil),
		nonEmpty: make(chan struct{}, 1),
		freed:    make(chan struct{}, 1),
		freedAt:  1,
	}
}

// SetFreedThreshold makes a removal (Pop, RemoveIf, DropHeadWhile) signal
// Freed only when at least n slots are free afterwards, or the bucket is
// empty (n ≤ 1: every removal, the default). A fetch loop that pulls only
// once n slots are free then wakes once per n departures instead of once per
// departure (issue 15: a wake-up per departure cost CPU for nothing).
// Release and SetCapacity always signal.
func (b *Bucket) SetFreedThreshold(n int) {
	b.mu.Lock()
	b.freedAt = max(1, n)
	b.mu.Unlock()
}

// freedDue reports whether a removal signals Freed; call with b.mu held.
func (b *Bucket) freedDue() bool {
	return b.fq.n == 0 || b.capacity-b.fq.n-b.reserved >= b.freedAt
}

// Fair reports whether the bucket serves keys by round robin.
func (b *Bucket) Fair() bool { return b.keyOf != nil }

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
	b.mu.Lock()
	b.capacity = max(1, capacity)
	b.mu.Unlock()
	notify(b.freed)
}

// Len returns the number of messages waiting (the bucket depth).
func (b *Bucket) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fq.n
}

// ActiveKeys returns how many keys have messages waiting (1 or 0 for a
// FIFO bucket).
func (b *Bucket) ActiveKeys() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.fq.active)
}

// Free returns the slots neither held nor reserved.
func (b *Bucket) Free() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.capacity - b.fq.n - b.reserved
}

// Reserve promises up to max free slots to a fetch and returns how many it
// promised (0 when the bucket is full). Each admitted message with
// reserved=true consumes one; Release returns the unused ones.
func (b *Bucket) Reserve(max int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := min(max, b.capacity-b.fq.n-b.reserved)
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

// Admit appends m at the back of its key's queue, stamping m.Admitted = now.
// With reserved it uses a slot promised by Reserve and cannot fail. Without,
// it returns ErrBucketFull when no slot is free; with fair queueing,
// ErrFairShare when m's key already holds its fair share while other keys
// wait (FairShare); or ErrMaxWait when maxWait > 0 and the projected wait —
// the messages that depart before m (all of them in a FIFO; under round
// robin at most min(held by j, held by m's key + 1) of each other key j)
// divided by rate (messages per second) — exceeds it. It reports whether
// the bucket was empty before.
func (b *Bucket) Admit(m *Message, now time.Time, reserved bool, rate float64, maxWait time.Duration) (wasEmpty bool, err error) {
	key := ""
	if b.keyOf != nil {
		key = b.keyOf(m)
	}
	b.mu.Lock()
	if reserved && b.reserved > 0 {
		b.reserved--
	} else {
		if b.fq.n+b.reserved >= b.capacity {
			b.mu.Unlock()
			return false, ErrBucketFull
		}
		held, keys := b.fq.held(key), len(b.fq.active)
		if held == 0 {
			keys++
		}
		if b.keyOf != nil && held >= FairShare(b.capacity, keys) {
			b.mu.Unlock()
			return false, ErrFairShare
		}
		if maxWait > 0 {
			if rate <= 0 || time.Duration(float64(b.fq.ahead(key))/rate*float64(time.Second)) > maxWait {
				b.mu.Unlock()
				return false, ErrMaxWait
			}
		}
	}
	m.Admitted = now
	b.fq.push(key, m)
	wasEmpty = b.fq.n == 1
	b.mu.Unlock()
	notify(b.nonEmpty)
	return wasEmpty, nil
}

// FairShare is the most messages one key may hold, in overflow mode
// "reject" with fair queueing, before its next message is refused
// (ErrFairShare): ceil(capacity / keys), keys counting the arriving
// message's own. A key alone may fill the bucket; when others wait it may
// not grow past its share (what it already holds stays and departs in
// turn). Overflow "block" admits only into reserved slots, so there the rule
// is the capacity and the fetch stopping when it is reached.
func FairShare(capacity, keys int) int {
	if keys <= 1 {
		return capacity
	}
	return (capacity + keys - 1) / keys
}

// Peek returns the next message to depart without removing it, or nil.
func (b *Bucket) Peek() *Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fq.peek()
}

// Pop removes and returns the next message to depart (the oldest of a FIFO;
// the oldest of the key whose turn it is under fair queueing), or nil when
// empty; it reports whether the bucket is empty afterwards. Under fair
// queueing it records the message's FairClass.
func (b *Bucket) Pop() (m *Message, nowEmpty bool) {
	b.mu.Lock()
	if b.fq.n == 0 {
		b.mu.Unlock()
		return nil, true
	}
	m = b.fq.pop(true)
	nowEmpty = b.fq.n == 0
	due := b.freedDue()
	b.mu.Unlock()
	if due {
		notify(b.freed)
	}
	return m, nowEmpty
}

// RemoveIf removes every waiting message for which drop reports true,
// keeping the others in order, and returns the removed ones (in order of
// admission) and whether the bucket is empty afterwards. drop runs under the
// bucket's lock: it must be quick and must not call the bucket.
func (b *Bucket) RemoveIf(drop func(*Message) bool) (removed []*Message, nowEmpty bool) {
	b.mu.Lock()
	removed = b.fq.removeIf(drop)
	nowEmpty = b.fq.n == 0
	due := b.freedDue()
	b.mu.Unlock()
	if len(removed) > 0 && due {
		notify(b.freed)
	}
	return removed, nowEmpty
}

// DropHeadWhile removes the next message to depart while drop reports true
// for it, and returns the removed ones and whether the bucket is empty
// afterwards. It stops at the first message drop keeps, so it costs what
// it removes, not the bucket's depth. Under fair queueing a removal does not
// use the key's turn: the next candidate is the same key's next message.
// drop runs under the bucket's lock.
func (b *Bucket) DropHeadWhile(drop func(*Message) bool) (removed []*Message, nowEmpty bool) {
	b.mu.Lock()
	for b.fq.n > 0 && drop(b.fq.peek()) {
		removed = append(removed, b.fq.pop(false))
	}
	nowEmpty = b.fq.n == 0
	due := b.freedDue()
	b.mu.Unlock()
	if len(removed) > 0 && due {
		notify(b.freed)
	}
	return removed, nowEmpty
}

// Each calls fn for every waiting message — oldest first within a key, the
// keys in the order of the round — under the bucket's lock: fn must be
// quick and must not call the bucket.
func (b *Bucket) Each(fn func(*Message)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, q := range b.fq.active {
		for _, e := range q.items[q.head:] {
			fn(e.m)
		}
	}
}

// NonEmpty returns a channel that receives a token after an admission; a
// waiter must re-check Len after each token.
func (b *Bucket) NonEmpty() <-chan struct{} { return b.nonEmpty }

// Freed returns a channel that receives a token after a slot is freed (with
// SetFreedThreshold, after a removal that leaves that many free).
func (b *Bucket) Freed() <-chan struct{} { return b.freed }

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// sortBySeq orders removed entries by admission.
func sortBySeq(es []entry) []*Message {
	slices.SortFunc(es, func(a, b entry) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]*Message, len(es))
	for i, e := range es {
		out[i] = e.m
	}
	return out
}
