package sourcetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// MemState is where a message of a [Mem] source is.
type MemState string

// The states of a [Mem] message.
const (
	Ready   MemState = "ready"   // waiting for delivery
	Pending MemState = "pending" // delivered, not settled; ack wait running
	Delayed MemState = "delayed" // nak'd with a delay that has not passed
	Acked   MemState = "acked"
	Termed  MemState = "termed"
)

// MemStream and MemSubject are the Stream and Subject of every message of a
// [Mem] source.
const (
	MemStream  = "MEM"
	MemSubject = "jobs"
)

// memFetchExpiry is how long one Fetch waits for messages, as a JetStream
// pull request does.
const memFetchExpiry = time.Second

// Mem is an in-memory stand-in for a JetStream pull consumer, with the
// server-side rules the lane depends on: explicit acks, NakWithDelay
// redelivering at the back with the delivery count increased, redelivery
// when ack wait runs out without an ack or in-progress, and term. It exists
// for tests on the fake clock of testing/synctest, where no real network may
// be used; the end-to-end tests use a real NATS server. It passes [Run].
//
// Messages have ids 0, 1, … in the order published, payloads "msg-<id>",
// Stream [MemStream], StreamSeq id+1 and Subject [MemSubject]. A Mem is safe
// for concurrent use; call Close at the end of a test so that its timers
// stop (a synctest bubble ends only when they do).
type Mem struct {
	mu        sync.Mutex
	ackWait   time.Duration
	queue     []*memMsg // ready for delivery, in order
	all       []*memMsg
	arrived   chan struct{}
	fetches   int
	redeliver int // redeliveries caused by ack wait expiry
	closed    bool
	// twice counts final verbs (ack, nak, term) sent for a delivery that
	// already had one: the lane must settle each delivery exactly once
	// (SPEC G4).
	twice int
	// publishedAgo back-dates the publish time of the next messages.
	publishedAgo time.Duration
}

type memMsg struct {
	src       *Mem
	id        int
	data      []byte
	header    map[string][]string
	published time.Time
	delivered uint64
	state     MemState
	sentAt    time.Time
	touched   time.Time
	verbs     []string
	termWhy   string
	timer     *time.Timer
}

// NewMem returns an empty source whose server redelivers a pending message
// ackWait after its delivery or its last in-progress ack (never when
// ackWait ≤ 0).
func NewMem(ackWait time.Duration) *Mem {
	return &Mem{ackWait: ackWait, arrived: make(chan struct{}, 1)}
}

// Publish appends n messages with the next ids.
func (s *Mem) Publish(n int) {
	s.mu.Lock()
	for range n {
		m := &memMsg{src: s, id: len(s.all), data: fmt.Appendf(nil, "msg-%d", len(s.all)), state: Ready,
			published: time.Now().Add(-s.publishedAgo)}
		s.all = append(s.all, m)
		s.queue = append(s.queue, m)
	}
	s.mu.Unlock()
	s.wake()
}

// PublishHeaders appends one message per header set, with the next ids
// (the headers a producer set: Shaper-Not-Before, Nats-Msg-Id, …).
func (s *Mem) PublishHeaders(hs ...map[string][]string) {
	s.mu.Lock()
	for _, h := range hs {
		m := &memMsg{src: s, id: len(s.all), data: fmt.Appendf(nil, "msg-%d", len(s.all)), header: h, state: Ready,
			published: time.Now().Add(-s.publishedAgo)}
		s.all = append(s.all, m)
		s.queue = append(s.queue, m)
	}
	s.mu.Unlock()
	s.wake()
}

// SetPublishedAgo back-dates the publish time of the messages published
// from now on by d (0: published when Publish is called).
func (s *Mem) SetPublishedAgo(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.publishedAgo = d
}

// SetData replaces the payload of message id for its next deliveries.
func (s *Mem) SetData(id int, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all[id].data = data
}

func (s *Mem) wake() {
	select {
	case s.arrived <- struct{}{}:
	default:
	}
}

// Fetch implements drain.Source: it delivers up to max ready messages,
// waiting for more until max arrived, ctx ends or a second passed.
func (s *Mem) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	s.mu.Lock()
	s.fetches++
	s.mu.Unlock()
	expire := time.NewTimer(memFetchExpiry)
	defer expire.Stop()
	got := 0
	for got < max {
		s.mu.Lock()
		var batch []*memMsg
		for len(s.queue) > 0 && got+len(batch) < max {
			m := s.queue[0]
			s.queue = s.queue[1:]
			m.delivered++
			m.state = Pending
			m.sentAt = time.Now()
			m.touched = m.sentAt
			m.armAckWait()
			batch = append(batch, m)
		}
		s.mu.Unlock()
		for _, m := range batch {
			got++
			msg := &shaper.Message{
				Subject: MemSubject, Data: m.data, Stream: MemStream, StreamSeq: uint64(m.id + 1), Published: m.published,
				NumDelivered: m.delivered, Received: time.Now(), Acker: &memAcker{m: m, seen: m.delivered},
			}
			// Packed, as the JetStream source delivers them (issue 15): the
			// lane must read them through the accessors until departure.
			msg.PackHeader(m.header)
			deliver(msg)
		}
		if got >= max {
			break
		}
		select {
		case <-s.arrived:
		case <-expire.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// armAckWait schedules the server's redelivery; s.mu is held.
func (m *memMsg) armAckWait() {
	if m.timer != nil {
		m.timer.Stop()
	}
	if m.src.ackWait <= 0 {
		return
	}
	d := m.touched.Add(m.src.ackWait).Sub(time.Now())
	m.timer = time.AfterFunc(d, func() {
		s := m.src
		s.mu.Lock()
		if m.state != Pending || s.closed || time.Since(m.touched) < s.ackWait {
			s.mu.Unlock()
			return
		}
		s.redeliver++
		m.state = Ready
		s.queue = append(s.queue, m)
		s.mu.Unlock()
		s.wake()
	})
}

func (m *memMsg) stopTimer() {
	if m.timer != nil {
		m.timer.Stop()
	}
}

// Close stops the redelivery timers (so that a synctest bubble can end);
// nothing is redelivered after it.
func (s *Mem) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, m := range s.all {
		m.stopTimer()
	}
}

// Count returns how many messages are in state.
func (s *Mem) Count(state MemState) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.all {
		if m.state == state {
			n++
		}
	}
	return n
}

// Fetches returns how many times Fetch was called.
func (s *Mem) Fetches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches
}

// Redelivered returns how many redeliveries ack wait expiry caused.
func (s *Mem) Redelivered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.redeliver
}

// SettledTwice returns how many final verbs (ack, nak, term) were sent for
// a delivery that already had one; a lane settles each delivery exactly
// once (SPEC G4), so tests assert it stays 0.
func (s *Mem) SettledTwice() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.twice
}

// MemMsg is a snapshot of one message of a [Mem] source.
type MemMsg struct {
	ID        int
	Data      []byte
	State     MemState
	Delivered uint64 // deliveries so far
	// Verbs are the verbs received, in order, each with the delivery it
	// was sent for: "ack@1", "nak@1", "wip@2", "term@2".
	Verbs      []string
	TermReason string
}

// Messages returns a snapshot of every message, in id order.
func (s *Mem) Messages() []MemMsg {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]MemMsg, 0, len(s.all))
	for _, m := range s.all {
		out = append(out, MemMsg{ID: m.id, Data: slices.Clone(m.data), State: m.state, Delivered: m.delivered,
			Verbs: slices.Clone(m.verbs), TermReason: m.termWhy})
	}
	return out
}

type memAcker struct {
	m    *memMsg
	seen uint64 // the delivery this handle belongs to
}

// verb records v; s.mu is held.
func (a *memAcker) verb(v string) (*memMsg, error) {
	m := a.m
	m.verbs = append(m.verbs, fmt.Sprintf("%s@%d", v, a.seen))
	if m.state != Pending || m.delivered != a.seen {
		if v != "wip" && m.delivered == a.seen {
			m.src.twice++
		}
		return nil, fmt.Errorf("message %d already settled (%s)", m.id, m.state)
	}
	return m, nil
}

func (a *memAcker) Ack(context.Context) error {
	s := a.m.src
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := a.verb("ack")
	if err != nil {
		return err
	}
	m.state = Acked
	m.stopTimer()
	return nil
}

func (a *memAcker) Nak(delay time.Duration) error {
	s := a.m.src
	s.mu.Lock()
	m, err := a.verb("nak")
	if err != nil {
		s.mu.Unlock()
		return err
	}
	m.state = Delayed
	m.stopTimer()
	s.mu.Unlock()
	time.AfterFunc(delay, func() {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		m.state = Ready
		s.queue = append(s.queue, m)
		s.mu.Unlock()
		s.wake()
	})
	return nil
}

func (a *memAcker) InProgress() error {
	s := a.m.src
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := a.verb("wip")
	if err != nil {
		return err
	}
	m.touched = time.Now()
	m.armAckWait()
	return nil
}

func (a *memAcker) Term(reason string) error {
	s := a.m.src
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := a.verb("term")
	if err != nil {
		return err
	}
	m.state = Termed
	m.termWhy = reason
	m.stopTimer()
	return nil
}
