package sources

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Standby (source.standby, SPEC §3): the replicas of a lane share one
// durable consumer with the pinned-client priority policy (nats-server
// 2.11+). The server hands messages only to the pull requests of the
// pinned replica; the pulls of the others wait in its queue and get
// nothing, so their buckets stay empty. The pin lasts while the pinned
// replica keeps pulling: a request carrying its pin id resets the server's
// StandbyPinnedTTL timer. When no such request arrives for that long (the
// replica was killed, stopped, or cut off), the server unpins it and pins
// the next waiting request, another replica's.
const (
	// StandbyGroup is the priority group the replicas of a standby lane
	// pull in.
	StandbyGroup = "shaper"
	// StandbyPinnedTTL is the consumer's PinnedTTL: how long the active
	// replica may go without a pull before another one takes over. It must
	// be well above KeepPinEvery and FetchExpiry (a loaded machine delays
	// both), and it is at least one interval of any lane at ≥ 1/s, which
	// is what keeps SPEC G1 across a takeover (docs/scaling.md).
	StandbyPinnedTTL = 3 * time.Second
	// KeepPinEvery is how often the active replica renews its pin with a
	// pull that can take no message (KeepPin), also while its bucket is
	// full and the lane fetches nothing.
	KeepPinEvery = 500 * time.Millisecond
	// StandbyTakeover bounds the time from the active replica's last pull
	// to the first message another replica receives: the pinned TTL, plus
	// the expiry of the pull in which the server pins the new replica.
	StandbyTakeover = StandbyPinnedTTL + FetchExpiry
)

// keepPinWait is how long a KeepPin request waits on the server.
const keepPinWait = 200 * time.Millisecond

// standby sets the pinned-client policy on cc when the lane is standby.
func (s *JetStream) standby(cc *jetstream.ConsumerConfig) {
	if !s.cfg.Standby {
		return
	}
	cc.PriorityPolicy = jetstream.PriorityPolicyPinned
	cc.PriorityGroups = []string{StandbyGroup}
	cc.PinnedTTL = StandbyPinnedTTL
}

// ErrStandbyUnsupported: the server did not keep the pinned-client policy
// of a standby lane's consumer (nats-server before 2.11 drops the fields it
// does not know), so every replica would receive messages and deliver.
var ErrStandbyUnsupported = errors.New("source.standby needs nats-server 2.11 or later: the server did not keep the consumer's pinned-client priority policy")

// standbyKept checks the consumer config the server answered with.
func (s *JetStream) standbyKept(got jetstream.ConsumerConfig) error {
	if !s.cfg.Standby {
		return nil
	}
	if got.PriorityPolicy != jetstream.PriorityPolicyPinned || !slices.Contains(got.PriorityGroups, StandbyGroup) {
		return fmt.Errorf("consumer %q on stream %q: %w", s.cfg.Durable, s.cfg.Stream, ErrStandbyUnsupported)
	}
	return nil
}

// fetchOpts are the options of every pull: the priority group of a
// standby lane (its pin id is kept and sent by the consumer).
func (s *JetStream) fetchOpts(opts ...jetstream.FetchOpt) []jetstream.FetchOpt {
	if s.cfg.Standby {
		opts = append(opts, jetstream.FetchPriorityGroup(StandbyGroup))
	}
	return opts
}

// notePin records whether this replica holds the pin, from a delivered
// message's Nats-Pin-Id header or a pull's error, and logs the changes.
func (s *JetStream) notePin(pinID string, err error) {
	if !s.cfg.Standby {
		return
	}
	switch {
	case pinID != "":
		if !s.active.Swap(true) {
			s.log.Info("standby: this replica is active (pinned)", "group", StandbyGroup)
		}
	case errors.Is(err, jetstream.ErrPinIDMismatch):
		if s.active.Swap(false) {
			s.log.Warn("standby: this replica lost the pin to another one", "group", StandbyGroup)
		}
	}
}

// Standby reports whether the lane is standby (drain.PinKeeper).
func (s *JetStream) Standby() bool { return s.cfg.Standby }

// Active reports whether this replica of a standby lane holds the pin
// (it received its last messages as the pinned client). Always true for a
// lane that is not standby.
func (s *JetStream) Active() bool { return !s.cfg.Standby || s.active.Load() }

// KeepPin renews the pin of an active standby replica (drain.PinKeeper):
// a pull in the group with a byte budget of one, which resets the
// server's pinned TTL when it arrives but can take no message (none fits in
// one byte: the server answers 409 and keeps the message for the next
// request). It does nothing for a lane that is not standby, or while this
// replica is not pinned (its lane's pulls wait in the group anyway).
func (s *JetStream) KeepPin(ctx context.Context) error {
	c := s.cons.Load()
	if !s.cfg.Standby || !s.active.Load() || c == nil {
		return nil
	}
	batch, err := (*c).Fetch(1, s.fetchOpts(jetstream.FetchMaxBytes(1), jetstream.FetchMaxWait(keepPinWait))...)
	if err != nil {
		return err
	}
	for msg := range batch.Messages() {
		// Cannot happen (no message fits in one byte); hand it back at
		// once rather than hold it outside the bucket.
		_ = msg.Nak()
	}
	err = batch.Error()
	s.notePin("", err)
	return err
}
