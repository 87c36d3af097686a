package sources

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// leaderElectedPrefix is the subject prefix of nats-server's advisory that a
// replicated consumer elected a leader:
// $JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.<stream>.<consumer>.
const leaderElectedPrefix = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED."

// leaderGrace is how long after a leader-elected advisory a pull that the
// old leader held may still end with its 409 "Leadership Change" before the
// source voids it itself (see leaderWatch); it is also how long before the
// advisory a pull must have been sent to count as sent to the old leader.
// The new leader sends the 409s and the advisory together; on this machine
// the advisory came 1–13 ms before the delivery on the re-issued pull
// (TestFetchAcrossLeaderChange).
const leaderGrace = 100 * time.Millisecond

// errLeaderElected ends a pull that the source voided after a consumer
// leader election (leaderWatch): Fetch re-issues it like a 409.
var errLeaderElected = errors.New("consumer leader elected; the pull sent to the old leader was voided")

// leaderWatch re-issues a pull that a consumer leader change left without
// an answer. The new leader ends the old leader's pending pulls with 409
// "Leadership Change" only when it knows of them: the old leader replicates
// each pull request through the consumer's Raft group, and only while it
// knows every peer runs nats-server ≥ 2.7.1 (consumer.go,
// checkAndSetPendingRequestsOk; a peer whose version it has not learned yet,
// as just after a cluster starts, turns that off for 30 s). A pull the new
// leader does not know of gets no answer at all, and the lane waited for
// its expiry (FetchExpiry) for every job published meanwhile.
//
// For a replicated consumer the source subscribes to the leader-elected
// advisory. A pull sent at least leaderGrace before the advisory came, that
// received nothing since, and that is still open leaderGrace after it (no
// 409 came), is voided (its FetchContext is cancelled) and re-issued at
// once. A 409 within 1 s before the advisory means the change was already
// handled, and nothing is voided. A voided pull that the new leader did hold
// loses nothing: what it sent after the unsubscribe is redelivered after the
// ack wait (nats-server checks a pull's interest before each delivery).
type leaderWatch struct {
	sub *nats.Subscription // nil: not a replicated consumer

	mu        sync.Mutex
	pull      uint64 // the open pull's number (0: none open)
	n         uint64
	started   time.Time          // when the open pull was sent
	lastMsg   time.Time          // its last message
	cancel    context.CancelFunc // voids it
	voided    bool               // it was voided by an advisory
	last409   time.Time          // the last 409 "Leadership Change"
	elections int64              // advisories seen (tests)
}

// watchLeader subscribes to the consumer's leader-elected advisories once
// the consumer is known to be replicated (info: the consumer's info after
// create or update). A subscription that fails is logged and left out: the
// 409 path still works.
func (s *JetStream) watchLeader(info *jetstream.ConsumerInfo) {
	if s.lw.sub != nil || info == nil || info.Cluster == nil || len(info.Cluster.Replicas) == 0 {
		return
	}
	sub, err := s.js.Conn().Subscribe(leaderElectedPrefix+s.cfg.Stream+"."+s.cfg.Durable, func(*nats.Msg) {
		at := time.Now()
		s.lw.mu.Lock()
		s.lw.elections++
		s.lw.mu.Unlock()
		time.AfterFunc(leaderGrace, func() { s.lw.elected(at) })
	})
	if err != nil {
		s.log.Warn("cannot watch the consumer's leader elections; a pull that a leader change leaves unanswered waits for its expiry", "err", err)
		return
	}
	s.lw.sub = sub
}

// elected voids the open pull if it was sent to the old leader and nothing
// ended it (see leaderWatch); at is when the advisory came.
func (w *leaderWatch) elected(at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pull == 0 || w.cancel == nil || !w.started.Before(at.Add(-leaderGrace)) ||
		w.lastMsg.After(at) || at.Sub(w.last409) < time.Second {
		return
	}
	w.voided = true
	w.cancel()
}

// open registers a pull about to be sent and returns its options (a
// FetchContext in place of FetchMaxWait, with the same expiry) and what
// closes it; without a subscription it changes nothing.
// done is closed when the pull expires or is voided (nil without a
// subscription).
func (w *leaderWatch) open(opts []jetstream.FetchOpt) (_ []jetstream.FetchOpt, done <-chan struct{}, close func() (voided bool)) {
	if w.sub == nil {
		return append(opts, jetstream.FetchMaxWait(FetchExpiry)), nil, func() bool { return false }
	}
	// FetchContext sets the pull's expiry to 90 % of the context's time.
	ctx, cancel := context.WithTimeout(context.Background(), FetchExpiry*10/9)
	w.mu.Lock()
	w.n++
	id := w.n
	w.pull, w.started, w.lastMsg, w.cancel, w.voided = id, time.Now(), time.Time{}, cancel, false
	w.mu.Unlock()
	return append(opts, jetstream.FetchContext(ctx)), ctx.Done(), func() bool {
		cancel()
		w.mu.Lock()
		defer w.mu.Unlock()
		v := w.voided && w.pull == id
		if w.pull == id {
			w.pull, w.cancel = 0, nil
		}
		return v
	}
}

// received notes a message of the open pull.
func (w *leaderWatch) received() {
	if w.sub == nil {
		return
	}
	w.mu.Lock()
	w.lastMsg = time.Now()
	w.mu.Unlock()
}

// silence409 (tests only) makes a pull that the server ended with 409
// "Leadership Change" look unanswered: the source waits until the pull
// expires or is voided, as for a pull the new leader did not know of.
var silence409 atomic.Bool

// changed notes a 409 "Leadership Change".
func (w *leaderWatch) changed() {
	w.mu.Lock()
	w.last409 = time.Now()
	w.mu.Unlock()
}
