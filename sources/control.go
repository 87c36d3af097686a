package sources

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ControlBucket is the JetStream key-value bucket where operators' decisions
// about lanes are kept (SPEC §3 Operator control): on the NATS server, so
// that a pause survives a restart and holds on every replica of a lane.
const ControlBucket = "SHAPER_CONTROL"

// LaneControl is what an operator decided about one lane: the value of key
// "lane.<name>" in ControlBucket.
type LaneControl struct {
	// Pause is the operator's pause in force, nil when none.
	Pause *PauseRecord `json:"pause,omitempty"`
	// PurgeUpTo is the highest stream sequence of the last purge: the lane
	// dead-letters every message up to it as purged, also when it is
	// redelivered later.
	PurgeUpTo uint64 `json:"purge_up_to,omitempty"`
	// PurgeStream is the stream PurgeUpTo counts in, and PurgeBefore the
	// server's time of its message PurgeUpTo: a purge covers only what that
	// stream stored by then (drain.PurgeMark), not a recreated stream's
	// new messages nor another stream's. Empty in records of earlier
	// versions, which are judged by the sequence alone.
	PurgeStream string    `json:"purge_stream,omitempty"`
	PurgeBefore time.Time `json:"purge_before,omitzero"`
	// ResumedAt is the last operator's resume, which also closes an open
	// breaker on every replica.
	ResumedAt time.Time `json:"resumed_at,omitzero"`
}

// PauseRecord is an operator's pause.
type PauseRecord struct {
	// Until is when it ends by itself; zero means until resumed.
	Until time.Time `json:"until,omitzero"`
	// Reason is the operator's text.
	Reason string `json:"reason,omitempty"`
	// At is when it was set.
	At time.Time `json:"at"`
}

// Control reads and writes ControlBucket.
type Control struct {
	kv jetstream.KeyValue
}

// ControlOption configures OpenControl.
type ControlOption func(*controlOptions)

type controlOptions struct{ log *slog.Logger }

// WithControlLogger sets the logger of OpenControl's warnings (default:
// discard).
func WithControlLogger(log *slog.Logger) ControlOption {
	return func(o *controlOptions) { o.log = log }
}

// OpenControl opens ControlBucket, creating it (file storage, one revision
// per key, replicas as given, at least 1) when missing. An existing bucket
// keeps its replicas (shaper never changes them, as it never changes an
// existing stream): when they differ from replicas (the largest
// source.replicas, SPEC §4), it logs one warning at Warn level with both
// numbers. The error wraps the server's when the bucket can be neither
// opened nor created.
func OpenControl(ctx context.Context, js jetstream.JetStream, replicas int, opts ...ControlOption) (*Control, error) {
	o := controlOptions{log: slog.New(slog.DiscardHandler)}
	for _, f := range opts {
		f(&o)
	}
	want := max(1, replicas)
	kv, err := js.KeyValue(ctx, ControlBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: ControlBucket, History: 1,
			Storage: jetstream.FileStorage, Replicas: want,
			Description: "shaper: operators' pauses, resumes and purges of lanes"})
	} else if err == nil {
		warnControlReplicas(ctx, kv, want, o.log)
	}
	if err != nil {
		return nil, fmt.Errorf("control bucket %s: %w", ControlBucket, err)
	}
	return &Control{kv: kv}, nil
}

// warnControlReplicas warns when the existing bucket's replicas differ from
// want. A status that cannot be read is logged at debug: the bucket works
// regardless.
func warnControlReplicas(ctx context.Context, kv jetstream.KeyValue, want int, log *slog.Logger) {
	st, err := kv.Status(ctx)
	if err != nil {
		log.Debug("control bucket status", "bucket", ControlBucket, "err", err)
		return
	}
	if have := max(1, st.Config().Replicas); have != want {
		log.Warn("control bucket replicas differ from source.replicas; the existing bucket keeps its replicas "+
			"(change them with `nats stream edit KV_"+ControlBucket+" --replicas N`)",
			"bucket", ControlBucket, "replicas", have, "want_replicas", want)
	}
}

func controlKey(lane string) string { return "lane." + lane }

// Get returns the lane's record (zero when none).
func (c *Control) Get(ctx context.Context, lane string) (LaneControl, error) {
	lc, _, err := c.get(ctx, lane)
	return lc, err
}

func (c *Control) get(ctx context.Context, lane string) (LaneControl, uint64, error) {
	var lc LaneControl
	e, err := c.kv.Get(ctx, controlKey(lane))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return lc, 0, nil
	}
	if err != nil {
		return lc, 0, err
	}
	if err := json.Unmarshal(e.Value(), &lc); err != nil {
		return lc, 0, fmt.Errorf("control record of lane %q: %w", lane, err)
	}
	return lc, e.Revision(), nil
}

// Update changes the lane's record with f, atomically against concurrent
// updates from other replicas (compare-and-set on the revision, retried).
func (c *Control) Update(ctx context.Context, lane string, f func(*LaneControl)) (LaneControl, error) {
	for {
		lc, rev, err := c.get(ctx, lane)
		if err != nil {
			return lc, err
		}
		f(&lc)
		b, _ := json.Marshal(lc)
		if rev == 0 {
			_, err = c.kv.Create(ctx, controlKey(lane), b)
		} else {
			_, err = c.kv.Update(ctx, controlKey(lane), b, rev)
		}
		if err == nil {
			return lc, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !strings.Contains(err.Error(), "wrong last sequence") {
			return lc, err
		}
		if ctx.Err() != nil {
			return lc, ctx.Err()
		}
	}
}

// Watch calls apply with every lane's record now and on every change,
// until stop is called. ready is closed once the records that existed when
// Watch was called were applied: a daemon starts its lanes after it, so
// that a lane paused before a restart does not depart before its pause is
// read.
func (c *Control) Watch(ctx context.Context, apply func(lane string, lc LaneControl)) (ready <-chan struct{}, stop func(), err error) {
	w, err := c.kv.Watch(ctx, "lane.*")
	if err != nil {
		return nil, nil, fmt.Errorf("watch %s: %w", ControlBucket, err)
	}
	r := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		initial := true
		for e := range w.Updates() {
			if e == nil { // the end of the initial values
				if initial {
					initial = false
					close(r)
				}
				continue
			}
			lane := strings.TrimPrefix(e.Key(), "lane.")
			var lc LaneControl
			if e.Operation() == jetstream.KeyValuePut {
				if err := json.Unmarshal(e.Value(), &lc); err != nil {
					continue
				}
			}
			apply(lane, lc)
		}
		if initial {
			close(r)
		}
	}()
	return r, func() { _ = w.Stop(); <-done }, nil
}
