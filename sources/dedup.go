package sources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DedupBucketPrefix starts the name of every lane's delivered-key bucket:
// lane "payments" keeps its keys in the key-value bucket
// "shaper_dedup_payments" (stream KV_shaper_dedup_payments). Lane names
// ([a-z0-9_-]+) are valid bucket names as they are, and one bucket per lane
// lets each lane have its own sink.dedup_window as the bucket's TTL.
const DedupBucketPrefix = "shaper_dedup_"

// KVDedup is drain.Dedup on a JetStream key-value bucket (SPEC §3
// Delivered-key dedup): one entry per delivered key, removed by the server
// after the window (the bucket's TTL). All replicas of a lane share it, and
// it lives on the NATS server, so it survives restarts of shaper (file
// storage: also of the server). Safe for concurrent use.
type KVDedup struct {
	kv     jetstream.KeyValue
	window time.Duration
}

// NewKVDedup creates or updates the delivered-key bucket of lane with TTL
// window (> 0) and replicas (≥ 1; a cluster's replication of the bucket).
// An existing bucket's TTL is set to window. Errors: window ≤ 0, or the
// bucket cannot be created or updated (no JetStream, permissions).
func NewKVDedup(ctx context.Context, js jetstream.JetStream, lane string, window time.Duration, replicas int) (*KVDedup, error) {
	if window <= 0 {
		return nil, fmt.Errorf("dedup window must be > 0, got %s", window)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      DedupBucketPrefix + lane,
		Description: "shaper: keys delivered by lane " + lane + " (sink.dedup_window)",
		TTL:         window,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("dedup bucket %q: %w", DedupBucketPrefix+lane, err)
	}
	return &KVDedup{kv: kv, window: window}, nil
}

// DedupKey is the bucket key of a message key (SPEC G8): the hex SHA-256 of
// it. A message key may hold any byte (Nats-Msg-Id is free text), while a
// bucket key allows only [-/_=.a-zA-Z0-9] without empty tokens; the hash
// is valid for every input and 64 bytes long whatever the key's length.
func DedupKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Seen implements drain.Dedup: whether key was recorded within the window.
// An entry older than the window that the server has not yet removed counts
// as not seen. Errors: the server did not answer (ctx), or JetStream failed.
func (d *KVDedup) Seen(ctx context.Context, key string) (bool, error) {
	e, err := d.kv.Get(ctx, DedupKey(key))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("dedup lookup: %w", err)
	}
	return time.Since(e.Created()) <= d.window, nil
}

// Record implements drain.Dedup: stores key as delivered now; it returns
// once the server has stored it (a publish ack). Errors: as Seen.
func (d *KVDedup) Record(ctx context.Context, key string) error {
	if _, err := d.kv.Put(ctx, DedupKey(key), nil); err != nil {
		return fmt.Errorf("dedup record: %w", err)
	}
	return nil
}
