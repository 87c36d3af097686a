package drain

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// memSource is an in-memory stand-in for a JetStream pull consumer, with the
// server-side rules the lane depends on: explicit acks, NakWithDelay
// redelivering at the back with the delivery count increased, redelivery
// when ack wait runs out without an ack or in-progress, and term. It exists
// for tests on the fake clock of testing/synctest, where no real network may
// be used; the end-to-end tests use a real NATS server.
type memSource struct {
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
	// (SPEC G4). harness.stop asserts it stays 0.
	twice int
	// publishedAgo back-dates the publish time of the next messages.
	publishedAgo time.Duration
}

type memMsg struct {
	src       *memSource
	id        int
	data      []byte
	header    map[string][]string
	published time.Time
	delivered uint64
	state     string // "ready", "pending", "acked", "termed"
	sentAt    time.Time
	touched   time.Time
	verbs     []string
	termWhy   string
	timer     *time.Timer
}

func newMemSource(ackWait time.Duration) *memSource {
	return &memSource{ackWait: ackWait, arrived: make(chan struct{}, 1)}
}

// publish appends n messages with ids from len(all).
func (s *memSource) publish(n int) { s.publishHeader(n, nil) }

// publishHeader appends n messages with ids from len(all), each with header.
func (s *memSource) publishHeader(n int, header map[string][]string) {
	s.mu.Lock()
	for range n {
		m := &memMsg{src: s, id: len(s.all), data: fmt.Appendf(nil, "msg-%d", len(s.all)), state: "ready",
			published: time.Now().Add(-s.publishedAgo), header: header}
		s.all = append(s.all, m)
		s.queue = append(s.queue, m)
	}
	s.mu.Unlock()
	select {
	case s.arrived <- struct{}{}:
	default:
	}
}

func (s *memSource) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	s.mu.Lock()
	s.fetches++
	s.mu.Unlock()
	expire := time.NewTimer(time.Second)
	defer expire.Stop()
	got := 0
	for got < max {
		s.mu.Lock()
		var batch []*memMsg
		for len(s.queue) > 0 && got+len(batch) < max {
			m := s.queue[0]
			s.queue = s.queue[1:]
			m.delivered++
			m.state = "pending"
			m.sentAt = time.Now()
			m.touched = m.sentAt
			m.armAckWait()
			batch = append(batch, m)
		}
		s.mu.Unlock()
		for _, m := range batch {
			got++
			deliver(&shaper.Message{
				Subject: "jobs", Header: m.header, Data: m.data, Stream: "MEM", StreamSeq: uint64(m.id + 1), Published: m.published,
				NumDelivered: m.delivered, Received: time.Now(), Acker: &memAcker{m: m, seen: m.delivered},
			})
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
		if m.state != "pending" || s.closed || time.Since(m.touched) < s.ackWait {
			s.mu.Unlock()
			return
		}
		s.redeliver++
		m.state = "ready"
		s.queue = append(s.queue, m)
		s.mu.Unlock()
		select {
		case s.arrived <- struct{}{}:
		default:
		}
	})
}

// close stops the redelivery timers so the synctest bubble can end.
func (s *memSource) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, m := range s.all {
		if m.timer != nil {
			m.timer.Stop()
		}
	}
}

func (s *memSource) count(state string) int {
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

type memAcker struct {
	m    *memMsg
	seen uint64 // the delivery this handle belongs to
}

func (a *memAcker) verb(v string) (*memMsg, error) {
	m := a.m
	m.verbs = append(m.verbs, fmt.Sprintf("%s@%d", v, a.seen))
	if m.state != "pending" || m.delivered != a.seen {
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
	m.state = "acked"
	m.timer.Stop()
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
	m.state = "delayed"
	m.timer.Stop()
	s.mu.Unlock()
	time.AfterFunc(delay, func() {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		m.state = "ready"
		s.queue = append(s.queue, m)
		s.mu.Unlock()
		select {
		case s.arrived <- struct{}{}:
		default:
		}
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
	m.state = "termed"
	m.termWhy = reason
	m.timer.Stop()
	return nil
}
