// Package sources holds the upstream edges of lanes: a JetStream durable pull
// consumer (and the embedded NATS server that is the product's default). The
// lane consumes them through drain.Source.
package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/internal/tick"
	"github.com/shaper-dev/shaper/shaper"
)

// FetchExpiry is the longest one pull request waits for messages. It bounds
// how long a drain waits for the fetch in progress, and how soon a lost pull
// request (server restart, NOTES.md) is replaced by a new one.
const FetchExpiry = time.Second

// pullExpiry is the expiry of a pull request sent at now: until the next
// instant of the process's grid of FetchExpiry (internal/tick). A quiet
// lane's pull expires and is renewed every FetchExpiry; on the grid, the
// pulls of every quiet lane of a process expire together, and one wake-up
// of the process serves them all instead of one each (issue 15: an idle
// daemon costs nothing). Less than a quarter of FetchExpiry before the
// grid, the pull runs to the half-grid after it instead, and the pull after
// that one is on the grid. So an expiry lies between a quarter of
// FetchExpiry and FetchExpiry, the second pull of a chain is on the grid,
// and FetchExpiry still bounds every pull.
func pullExpiry(now time.Time) time.Duration {
	d := tick.Until(now, FetchExpiry)
	if d < FetchExpiry/4 {
		d += FetchExpiry / 2
	}
	return d
}

// JetStreamConfig describes the stream and durable consumer of one lane.
type JetStreamConfig struct {
	// Stream is created with Subjects when it does not exist (file storage).
	// An existing stream is used as it is.
	Stream   string
	Subjects []string
	// Durable is the consumer name (shaper-<lane> by default in the config).
	Durable string
	// AckWait is the server's redelivery timeout of an unacknowledged message.
	AckWait time.Duration
	// MaxAckPending caps the messages the server hands out unacknowledged;
	// 0 lets the server choose.
	MaxAckPending int
	// Limits are the stream's retention and limits when it is created
	// (source.retention); nil creates it with none (every message kept).
	Limits *StreamLimits
	// Standby makes the consumer a pinned-client priority group
	// (source.standby, standby.go).
	Standby bool
	// RedeliverHeld hands out a redelivery of a message whose earlier copy
	// has had no final verb yet. Off (the daemon's), Fetch leaves such a
	// copy out (held.go); on, a test sees the server's redeliveries as
	// they come (sourcetest's ack-wait timing).
	RedeliverHeld bool
}

// JetStream is a lane's source: a durable pull consumer with explicit acks
// that fetches exactly as many messages as the lane asks for (SPEC §3,
// overflow block). It is created or updated idempotently, and re-created when
// the server lost it. MaxDeliver on the server is unlimited: the lane counts
// deliveries itself and dead-letters at source.max_deliver, so that no
// message is ever parked silently by the server.
type JetStream struct {
	js     jetstream.JetStream
	cfg    JetStreamConfig
	log    *slog.Logger
	cons   atomic.Pointer[jetstream.Consumer]
	bound  atomic.Bool
	active atomic.Bool // standby: this replica holds the pin (standby.go)
	held   heldSeqs    // handed to the lane, no final verb yet (held.go)

	leaderRepulls atomic.Int64 // pulls re-issued after a 409 "Leadership Change" (tests)
}

// NewJetStream ensures the stream and the consumer exist and returns the
// source. Errors: the stream cannot be created or read, or the consumer
// cannot be created or updated (e.g. an existing consumer of another kind).
func NewJetStream(ctx context.Context, js jetstream.JetStream, cfg JetStreamConfig, log *slog.Logger) (*JetStream, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &JetStream{js: js, cfg: cfg, log: log.With("stream", cfg.Stream, "consumer", cfg.Durable)}
	if err := EnsureStreamLimits(ctx, js, cfg.Stream, cfg.Subjects, cfg.Limits, log); err != nil {
		return nil, err
	}
	if err := s.bind(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// EnsureStream creates stream name capturing subjects, with file storage
// and no limits, when it does not exist: EnsureStreamLimits with nil limits.
func EnsureStream(ctx context.Context, js jetstream.JetStream, name string, subjects []string) error {
	return EnsureStreamLimits(ctx, js, name, subjects, nil, nil)
}

// EnsureStreamLimits creates stream name capturing subjects, with file
// storage and limits (retention, max age, max bytes; nil = limits retention
// and no limits), when it does not exist. An existing stream keeps its
// retention and limits: when they differ from limits (not nil), a warning
// saying so is logged to log, and nothing is changed (issue 12: changing
// the retention of a stream in use changes what it keeps, or is refused by
// the server). An existing stream that lacks some of subjects is extended
// with them, and a warning names what was added (two lanes on one stream,
// or a subject added to a lane).
func EnsureStreamLimits(ctx context.Context, js jetstream.JetStream, name string, subjects []string,
	limits *StreamLimits, log *slog.Logger) error {
	st, err := js.Stream(ctx, name)
	if err == nil {
		limits.warnIfDiffers(log, name, st.CachedInfo().Config)
		// An existing stream must capture the lane's subjects (two lanes on
		// one stream, or a subject added to a lane): add what it lacks.
		cfg := st.CachedInfo().Config
		var missing []string
		for _, want := range subjects {
			covered := false
			for _, have := range cfg.Subjects {
				if subjectCovers(have, want) {
					covered = true
					break
				}
			}
			if !covered {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		have := cfg.Subjects
		cfg.Subjects = append(slices.Clone(have), missing...)
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("stream %q does not capture %v and cannot be extended: %w", name, missing, err)
		}
		// A change to a stream someone else may own, which stays after the
		// lane is gone: say so (found by a new-user pass; it was silent).
		if log != nil {
			log.Warn("existing stream extended with the lane's subjects it did not capture; remove them by hand if they were a mistake",
				"stream", name, "added", missing, "subjects_before", have)
		}
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("stream %q: %w", name, err)
	}
	sc := jetstream.StreamConfig{
		Name:      name,
		Subjects:  subjects,
		Storage:   jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy,
	}
	limits.apply(&sc)
	_, err = js.CreateStream(ctx, sc)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("create stream %q: %w", name, err)
	}
	return nil
}

// subjectCovers reports whether every subject matched by want is matched by
// have (NATS wildcards: "*" one token, ">" the rest).
func subjectCovers(have, want string) bool {
	h, w := strings.Split(have, "."), strings.Split(want, ".")
	for i, ht := range h {
		if ht == ">" {
			return i < len(w)
		}
		if i >= len(w) {
			return false
		}
		switch {
		case w[i] == ">":
			return false
		case ht == "*" || ht == w[i]:
		default:
			return false
		}
	}
	return len(h) == len(w)
}

func (s *JetStream) bind(ctx context.Context) error {
	cc := jetstream.ConsumerConfig{
		Durable:       s.cfg.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: s.cfg.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if len(s.cfg.Subjects) == 1 {
		cc.FilterSubject = s.cfg.Subjects[0]
	} else {
		cc.FilterSubjects = s.cfg.Subjects
	}
	s.standby(&cc)
	if err := s.startPolicy(ctx, &cc); err != nil {
		s.bound.Store(false)
		return err
	}
	c, err := s.js.CreateOrUpdateConsumer(ctx, s.cfg.Stream, cc)
	if err != nil {
		s.bound.Store(false)
		return fmt.Errorf("consumer %q on stream %q differs from the lane (source.ack_wait, source.max_ack_pending, source.subjects, explicit acks) and the server refuses to update it (delete the consumer, or restore its settings): %w",
			s.cfg.Durable, s.cfg.Stream, err)
	}
	if err := s.standbyKept(c.CachedInfo().Config); err != nil {
		s.bound.Store(false)
		return err
	}
	s.cons.Store(&c)
	s.bound.Store(true)
	return nil
}

// startPolicy sets where the consumer starts (consumer drift, case C36).
// An existing consumer keeps its deliver policy (the server refuses to
// change it); everything else of the config is applied to it by the update
// (ack_wait, max_ack_pending, filter subjects). A new consumer on a stream
// that another durable consumer with an overlapping filter already reads
// (source.consumer renamed) starts after the highest ack floor among them,
// so the downstream does not get the stream's history again; the consumer
// left behind is named in a warning. A new consumer with no predecessor
// starts at the beginning of the stream (DeliverAll): on a first start the
// stream's content is the backlog to deliver.
func (s *JetStream) startPolicy(ctx context.Context, cc *jetstream.ConsumerConfig) error {
	if c, err := s.js.Consumer(ctx, s.cfg.Stream, s.cfg.Durable); err == nil {
		have := c.CachedInfo().Config
		cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = have.DeliverPolicy, have.OptStartSeq, have.OptStartTime
		return nil
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("consumer %q on stream %q: %w", s.cfg.Durable, s.cfg.Stream, err)
	}
	st, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return fmt.Errorf("stream %q: %w", s.cfg.Stream, err)
	}
	var floor uint64
	var from string
	for info := range st.ListConsumers(ctx).Info() {
		if info.Config.Durable == "" || !filtersOverlap(info.Config, s.cfg.Subjects) {
			continue
		}
		if info.AckFloor.Stream >= floor {
			floor, from = info.AckFloor.Stream, info.Name
		}
	}
	if from == "" {
		return nil // DeliverAll
	}
	cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
	s.log.Warn("new consumer starts after the ack floor of an existing consumer on the same subjects (source.consumer renamed?); that consumer is left behind with its state: delete it when it is no longer used",
		"old_consumer", from, "new_consumer", s.cfg.Durable, "start_seq", floor+1, "not_redelivered", floor)
	return nil
}

// filtersOverlap reports whether the consumer config c reads any of subjects.
func filtersOverlap(c jetstream.ConsumerConfig, subjects []string) bool {
	filters := c.FilterSubjects
	if c.FilterSubject != "" {
		filters = append(filters, c.FilterSubject)
	}
	if len(filters) == 0 {
		return true // the whole stream
	}
	for _, f := range filters {
		for _, want := range subjects {
			if subjectCovers(f, want) || subjectCovers(want, f) {
				return true
			}
		}
	}
	return false
}

// Connected reports whether the NATS connection is up (drain.Connector):
// while it is not, the lane holds its departures.
func (s *JetStream) Connected() bool { return s.js.Conn().IsConnected() }

// Bound reports whether the consumer is bound: created, and the last pull
// did not fail.
func (s *JetStream) Bound() bool { return s.bound.Load() }

// leaderChangeRepulls is how many times one Fetch re-issues a pull that the
// server ended with 409 "Leadership Change" before it reports the error.
const leaderChangeRepulls = 5

// Fetch implements drain.Source: one pull request for up to max messages,
// expiring at the pull grid's next instant (pullExpiry: at most
// FetchExpiry). Every message received is passed to deliver.
//
// A pull that the server ends with a leadership change of the consumer
// (status 409 "Leadership Change": the pending pull requests of the old
// leader are void) is re-issued at once for the slots still free, without
// the lane's fetch back-off and without marking the source unbound: nats.go
// does not re-issue it (NOTES.md), and waiting would stall the lane for
// the back-off or a heartbeat timeout.
func (s *JetStream) Fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	got := 0
	count := func(m *shaper.Message) { got++; deliver(m) }
	for changed, quiet := 0, 0; ; {
		err := s.fetch(ctx, max-got, count)
		if got >= max {
			return err
		}
		var nl noLeader
		if errors.As(err, &nl) && quiet < noLeaderRepulls && ctx.Err() == nil {
			// For the moment of a leader change the consumer has no
			// leader and the server answers "no responders": try again
			// shortly, a few times, before the lane sees a failure (an
			// election after a kill lasts seconds: then it does).
			quiet++
			select {
			case <-ctx.Done():
				return err
			case <-time.After(noLeaderRepullEvery):
			}
			continue
		}
		if !errors.Is(err, jetstream.ErrConsumerLeadershipChanged) || changed == leaderChangeRepulls {
			return err
		}
		changed++
		s.leaderRepulls.Add(1)
		s.log.Info("consumer leader changed; pull re-issued", "delivered", got)
	}
}

// noLeaderRepulls and noLeaderRepullEvery: a pull that no server answered
// ("no responders", noLeader) is tried again that many times, that far
// apart (250 ms in all), within one Fetch: a consumer leader step-down
// leaves the consumer without a leader for a moment (TestFetchAcrossLeaderChange
// saw hundreds of such answers in a tight loop once), which must not
// surface to the lane as a failed fetch.
const (
	noLeaderRepulls     = 5
	noLeaderRepullEvery = 50 * time.Millisecond
)

// fetch is one pull request of Fetch.
func (s *JetStream) fetch(ctx context.Context, max int, deliver func(*shaper.Message)) error {
	c := s.cons.Load()
	if c == nil {
		if err := s.bind(ctx); err != nil {
			return err
		}
		c = s.cons.Load()
	}
	opts := []jetstream.FetchOpt{jetstream.FetchMaxWait(pullExpiry(time.Now()))}
	if mp := s.js.Conn().MaxPayload(); needsByteBudget(max, mp) { // fetchbytes.go
		opts = append(opts, jetstream.FetchMaxBytes(pullMaxBytes(mp)))
	}
	batch, err := (*c).Fetch(max, s.fetchOpts(opts...)...)
	if err != nil {
		return s.fail(ctx, err)
	}
	nc := s.js.Conn()
	sh := shared{held: &s.held} // shared by the messages of this pull (jsmessage.go)
	var again []uint64          // redeliveries of messages the lane holds (held.go)
	for msg := range batch.Messages() {
		s.notePin(msg.Headers().Get("Nats-Pin-Id"), nil)
		m, err := newMessage(msg, nc, &sh, time.Now())
		if err != nil {
			// Not a JetStream delivery we can account for: hand it to the
			// lane as invalid, which dead-letters it with the reason.
			m = &shaper.Message{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data(),
				Received: time.Now(), Acker: acker{msg}, Invalid: "no JetStream metadata: " + err.Error()}
		} else if !s.held.add(m.StreamSeq) && !s.cfg.RedeliverHeld {
			again = append(again, m.StreamSeq)
			continue
		}
		deliver(m)
	}
	if len(again) > 0 {
		s.log.Info("redelivered messages the lane still holds were not admitted twice: their ack wait passed where no in-progress ack reached the server (an outage?); the held copies settle them",
			"messages", len(again), "first_stream_seq", again[0])
	}
	if err := batch.Error(); err != nil && !endedByBytes(err) { // fetchbytes.go
		s.notePin("", err)
		if errors.Is(err, jetstream.ErrConsumerLeadershipChanged) {
			return err // re-issued by Fetch; the consumer is still bound
		}
		return s.fail(ctx, err)
	}
	s.bound.Store(true)
	return nil
}

// noLeader is a pull that no server answered but with "no responders": the
// consumer has no leader (an election after the kill of its node), or the
// stream is gone. RetrySoon tells the lane's fetch loop to try again within
// a quarter of a second (drain/fetch.go): the server answers such a pull at
// once, and the lane resumes as soon as a leader is elected.
type noLeader struct{ err error }

func (e noLeader) Error() string   { return e.err.Error() }
func (e noLeader) Unwrap() error   { return e.err }
func (e noLeader) RetrySoon() bool { return true }

// fail marks the source unbound and re-creates the consumer when the server
// lost it.
func (s *JetStream) fail(ctx context.Context, err error) error {
	if errors.Is(err, nats.ErrNoResponders) {
		err = noLeader{err}
	}
	s.bound.Store(false)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrStreamNotFound) {
		if err := EnsureStreamLimits(ctx, s.js, s.cfg.Stream, s.cfg.Subjects, s.cfg.Limits, s.log); err != nil {
			return err
		}
		if berr := s.bind(ctx); berr != nil {
			return berr
		}
	}
	return err
}

// acker maps the lane's verbs onto JetStream's.
type acker struct{ msg jetstream.Msg }

// Ack is fire-and-forget (a DoubleAck per message caps a consumer near
// 30k/s, NOTES.md); the daemon flushes the connection before it closes, so
// the acks of a drain reach the server (case C19).
func (a acker) Ack(context.Context) error { return a.msg.Ack() }

func (a acker) Nak(delay time.Duration) error {
	if delay <= 0 {
		return a.msg.Nak()
	}
	return a.msg.NakWithDelay(delay)
}

func (a acker) InProgress() error { return a.msg.InProgress() }

func (a acker) Term(reason string) error { return a.msg.TermWithReason(reason) }

// Connect dials url with reconnects forever (a lane must outlive server
// restarts, case C21), logging connection state changes.
func Connect(url string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base := []nats.Option{
		nats.Name("shaper"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: closed by us
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
		}),
		// Asynchronous errors (a slow consumer, "consumer not active" of a
		// watch during an outage) through the daemon's logger: without a
		// handler nats.go prints them raw on stderr, which broke the JSON
		// log of a new-user pass.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Warn("nats asynchronous error", "subject", sub.Subject, "err", err)
				return
			}
			log.Warn("nats asynchronous error", "err", err)
		}),
	}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats: %w", err)
	}
	return nc, nil
}
