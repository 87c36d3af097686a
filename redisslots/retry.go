package redisslots

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"
)

// retryOnce reports whether a failed reservation is tried once more before
// Reserve gives up (and the lane falls back to limit / replicas_hint): a
// call that ran out of time (one late answer is not an outage), or whose
// connection broke under it (EOF, reset, broken pipe, closed) — what a
// Sentinel or Cluster failover does to the connections to the old master
// (go-redis closes them on +switch-master; the server kills its clients).
// The retry dials afresh and so reaches the new master. Falling back on
// such an error alone would put this replica's fallback rate on top of the
// limit the other replicas still share (docs/scaling.md, "What happens
// when…"). A refused connection or an error reply is not retried: the
// server is down, or answered.
//
// The retry is given retryTimeouts × redis.timeout: a manual CLUSTER
// FAILOVER pauses the old master's clients until its replica has caught up
// (67 ms in TestGlobalRateRedisCluster, more than the 50 ms default), and
// the answer then comes as a MOVED redirect to the new master; one replica
// that fell back alone there put 73 departures in a 1 s window of a 50/s
// lane. Waiting longer only delays this replica's next departure (a gap,
// never a burst); falling back adds its fallback rate on top of the limit.
func retryOnce(err error) bool {
	if isTimeout(err) {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}

// retryTimeouts is the retry's deadline, in multiples of redis.timeout.
const retryTimeouts = 6

// retryKey marks the context of the retry (runAll gives it the longer
// deadline).
type retryKey struct{}

// asRetry returns ctx marked as the retry's.
func asRetry(ctx context.Context) context.Context { return context.WithValue(ctx, retryKey{}, true) }

// callTimeout is the deadline of one call under ctx.
func callTimeout(ctx context.Context, timeout time.Duration) time.Duration {
	if ctx.Value(retryKey{}) != nil {
		return retryTimeouts * timeout
	}
	return timeout
}
