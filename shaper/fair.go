package shaper

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Fair queueing (SPEC §3 Fairness, bucket.fair_key).
//
// The bucket keeps one FIFO per key and a round of the keys that have
// messages waiting. Each Pop takes the oldest message of the key whose turn
// it is and passes the turn to the next key of the round. This is deficit
// round robin with a quantum of one message and a cost of one per message:
// the lane's messages cost the same (one departure slot each), so the deficit
// counter of DRR is always 0 or 1 and is left out. A key that gets a first
// message joins the round at its end (just before the key whose turn it
// is); a key whose queue empties leaves it.
// With k keys waiting, a key's next message departs within k departures,
// whatever the others hold; the lane's rate and G1 are the pacer's and do
// not change.

// FairClassTop and FairClassRest are the values of Message.FairClass and of
// the class label of shaper_fair_queue_wait_seconds: a bounded set, never
// the key itself.
const (
	// FairClassTop: the message's key held the most messages of any key
	// (ties included), more than one, when it departed — the burst.
	FairClassTop = "top"
	// FairClassRest: every other departure of a fair lane.
	FairClassRest = "rest"
)

// FairClasses lists the key classes, for label values created up front.
var FairClasses = []string{FairClassTop, FairClassRest}

// FairClass returns the key class recorded when a fair bucket popped m
// (FairClassTop or FairClassRest), or "" for a FIFO bucket.
func (m *Message) FairClass() string {
	switch m.fairClass {
	case classTop:
		return FairClassTop
	case classRest:
		return FairClassRest
	}
	return ""
}

// fairClass is Message.FairClass in one byte (a string field would cost 16
// per queued message, issue 15).
type fairClass uint8

const (
	classNone fairClass = iota
	classTop
	classRest
)

// ErrFairKey is wrapped by FairKeyFunc for a value of bucket.fair_key it
// cannot use.
var ErrFairKey = errors.New("shaper: invalid fair key")

// FairKeyFunc returns the key function of a bucket.fair_key value: nil for ""
// (one FIFO); for "subject:N" the subject's token N counted from 0 (tokens
// split at "."); otherwise the first value of the header of that exact name
// (lookups are exact, as Message.Header). A message without the token or the
// header has key "", one key shared by all such messages. A header name must
// be a token of RFC 7230 (letters, digits and !#$%&'*+-.^_`|~).
func FairKeyFunc(spec string) (func(*Message) string, error) {
	if spec == "" {
		return nil, nil
	}
	if rest, ok := strings.CutPrefix(spec, "subject:"); ok {
		n, err := strconv.Atoi(rest)
		if err != nil || n < 0 || rest != strconv.Itoa(n) {
			return nil, fmt.Errorf("%w: %q: subject:N needs a token index N ≥ 0", ErrFairKey, spec)
		}
		return func(m *Message) string { return subjectToken(m.Subject, n) }, nil
	}
	for _, c := range spec {
		if !isTokenChar(c) {
			return nil, fmt.Errorf("%w: %q: a header name is a token (letters, digits, !#$%%&'*+-.^_`|~) or subject:N", ErrFairKey, spec)
		}
	}
	return func(m *Message) string {
		v, _ := m.HeaderValue(spec)
		return v
	}, nil
}

func subjectToken(subject string, n int) string {
	for i := 0; ; i++ {
		tok, rest, more := strings.Cut(subject, ".")
		if i == n {
			return tok
		}
		if !more {
			return ""
		}
		subject = rest
	}
}

func isTokenChar(c rune) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", c)
}

// entry is a message held with its admission sequence number.
type entry struct {
	m   *Message
	seq uint64
}

// keyQueue is the FIFO of one key: items[head:] wait, oldest first.
//
// Its entries outside items[head:] are zero up to the slice's capacity (pop,
// its compaction and removeIf clear them): a message that left stays
// reachable from no queue, a spare one included (fairQueue.spare).
type keyQueue struct {
	key   string
	items []entry
	head  int
}

func (q *keyQueue) len() int { return len(q.items) - q.head }

// fairQueue is the round of per-key FIFOs behind Bucket. A FIFO bucket is
// the same structure with the one key "". Not safe for concurrent use: the
// Bucket's lock guards it.
type fairQueue struct {
	queues  map[string]*keyQueue
	active  []*keyQueue // the round: keys with messages waiting
	turn    int         // index in active of the key whose turn it is
	n       int         // messages held
	seq     uint64      // admissions so far
	last    *keyQueue   // the queue found last (one FIFO: the only one)
	classes bool        // keep byCount and top (a fair bucket: FairClass)
	byCount []int       // byCount[c]: how many keys hold c messages, for c ≥ 1
	top     int         // the most messages one key holds
	// spare is the last queue that emptied, kept (when small) for the next
	// key that needs one: a FIFO bucket that a lane at full speed empties
	// and refills allocated a queue and grew its slice again at every
	// refill, 40 heap bytes a message (issue 15, throughput).
	spare *keyQueue
}

// spareMax is the most entries a spare queue's slice may hold (16 bytes
// each): a larger one goes with its queue.
const spareMax = 4096

func newFairQueue(classes bool) fairQueue {
	return fairQueue{queues: map[string]*keyQueue{}, classes: classes}
}

// queue returns key's queue, or nil when key has none waiting.
func (f *fairQueue) queue(key string) *keyQueue {
	if f.last != nil && f.last.key == key {
		return f.last
	}
	q := f.queues[key]
	if q != nil {
		f.last = q
	}
	return q
}

// drop forgets q, whose queue emptied, and keeps it as the spare when its
// slice is small.
func (f *fairQueue) drop(q *keyQueue) {
	delete(f.queues, q.key)
	if f.last == q {
		f.last = nil
	}
	if cap(q.items) <= spareMax { // its entries are all zero (keyQueue)
		*q = keyQueue{items: q.items[:0]}
		f.spare = q
	}
}

func (f *fairQueue) held(key string) int {
	if q := f.queue(key); q != nil {
		return q.len()
	}
	return 0
}

// ahead bounds the messages that depart before a new message of key: all
// of its own, and at most one more than that of each other key.
func (f *fairQueue) ahead(key string) int {
	own := f.held(key)
	n := own
	for _, q := range f.active {
		if q.key != key {
			n += min(q.len(), own+1)
		}
	}
	return n
}

func (f *fairQueue) count(from, to int) {
	if !f.classes {
		return
	}
	if from > 0 {
		f.byCount[from]--
	}
	if to > 0 {
		for to >= len(f.byCount) {
			f.byCount = append(f.byCount, 0)
		}
		f.byCount[to]++
	}
	switch {
	case to > f.top:
		f.top = to
	case from == f.top && f.byCount[from] == 0:
		f.top = to // the key that held the most now holds one less: still the most
	}
}

func (f *fairQueue) push(key string, m *Message) {
	q := f.queue(key)
	if q == nil {
		if q = f.spare; q != nil {
			f.spare = nil
			q.key = key
		} else {
			q = &keyQueue{key: key}
		}
		f.queues[key], f.last = q, q
		// The tail of the round is just before the key whose turn it is.
		f.active = slices.Insert(f.active, f.turn, q)
		if len(f.active) > 1 {
			f.turn++
		}
	}
	f.seq++
	q.items = append(q.items, entry{m, f.seq})
	f.n++
	f.count(q.len()-1, q.len())
}

func (f *fairQueue) peek() *Message {
	if f.n == 0 {
		return nil
	}
	q := f.active[f.turn]
	return q.items[q.head].m
}

// pop removes the next message; advance passes the turn to the next key (a
// departure) — a removal that is not a departure keeps it.
func (f *fairQueue) pop(advance bool) *Message {
	q := f.active[f.turn]
	held := q.len()
	m := q.items[q.head].m
	if advance && f.classes {
		m.fairClass = classRest
		if held > 1 && held == f.top {
			m.fairClass = classTop
		}
	}
	q.items[q.head] = entry{}
	q.head++
	if q.head > 32 && q.head*2 >= len(q.items) { // reclaim the consumed front
		n := len(q.items)
		q.items = append(q.items[:0], q.items[q.head:]...)
		clear(q.items[len(q.items):n]) // the moved entries' old places
		q.head = 0
	}
	f.n--
	f.count(held, held-1)
	if q.len() == 0 {
		f.drop(q)
		f.active = slices.Delete(f.active, f.turn, f.turn+1)
	} else if advance {
		f.turn++
	}
	if f.turn >= len(f.active) {
		f.turn = 0
	}
	return m
}

func (f *fairQueue) removeIf(drop func(*Message) bool) []*Message {
	var removed []entry
	active := f.active[:0]
	turn := -1
	for i, q := range f.active {
		kept := q.items[:q.head]
		for _, e := range q.items[q.head:] {
			if drop(e.m) {
				removed = append(removed, e)
				continue
			}
			kept = append(kept, e)
		}
		clear(q.items[len(kept):])
		q.items = kept
		if q.len() == 0 {
			f.drop(q)
			continue
		}
		if turn < 0 && i >= f.turn {
			turn = len(active) // the key whose turn it was, or the next that is left
		}
		active = append(active, q)
	}
	clear(f.active[len(active):])
	f.active = active
	f.turn = max(0, turn)
	if f.turn >= len(f.active) {
		f.turn = 0
	}
	if len(removed) == 0 {
		return nil
	}
	f.n -= len(removed)
	clear(f.byCount)
	f.top = 0
	for _, q := range f.active {
		f.count(0, q.len())
	}
	return sortBySeq(removed)
}
