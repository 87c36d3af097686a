package redisslots

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/shaper-dev/shaper/drain"
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
// when…"). An error reply is not retried: the server answered. A refused
// connection is not retried here: the server is down, or restarting, which
// awaitRestart waits for.
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

// refused reports whether err is a connection the server refused: nothing
// listens on its port (down, or restarting).
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// restartWait is how long a reservation refused after an answer waits for
// the server to listen again before Reserve gives up (the lane falls
// back), and restartRedial how often it tries its port. A redis-server
// restarted on its dump refused connections for 46–66 ms here (field case
// C33). Falling back at the first refusal put one replica's fallback rate
// (limit / replicas_hint) on top of the limit the others still shared,
// because only the replica whose call fell in those milliseconds saw the
// outage: 28–30 departures in a 1 s window of a 20/s lane over two
// replicas (TestCase_C33_RedisFailoverScriptCacheClockLeases). It is the
// broken connection's retry budget at the default timeout (retryTimeouts ×
// config.DefaultRedisTimeout): an outage longer than that costs this
// replica one gap of restartWait, once, before it falls back.
const (
	restartWait   = 300 * time.Millisecond
	restartRedial = 50 * time.Millisecond
)

// awaitRestart waits, for up to restartWait, until the address that
// refused the call (err's) accepts a connection again, then reserves; it
// returns err when the server did not come back. It tries the port with
// its own dialer, not go-redis's: the pool counts every failed dial
// towards a breaker (PoolSize failures, 10 × GOMAXPROCS by default, after
// which it stops dialling and tries once a second in the background, and
// only that resets the count), so redials through it would trip the
// breaker over a few restarts, and the return from the next outage would
// wait up to a second. s.mu is held, and released while it sleeps (as
// adoptAhead does): a Pause or Shift of a task does not wait for it. The
// departure loop waits: a gap, never a burst.
func (s *LaneSlots) awaitRestart(ctx context.Context, r drain.SlotRequest, err error) (lease, error) {
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Addr == nil {
		return lease{}, err
	}
	addr := oe.Addr.String()
	deadline := time.Now().Add(restartWait)
	d := net.Dialer{Timeout: restartRedial}
	for time.Now().Before(deadline) {
		s.mu.Unlock()
		t := time.NewTimer(restartRedial)
		var c net.Conn
		var derr error
		select {
		case <-ctx.Done():
			derr = ctx.Err()
		case <-t.C:
			c, derr = d.DialContext(ctx, "tcp", addr)
		}
		t.Stop()
		s.mu.Lock()
		if ctx.Err() != nil {
			return lease{}, ctx.Err()
		}
		if derr != nil {
			continue
		}
		_ = c.Close()
		return s.reserveRetrying(ctx, r) // accepted, then broken: as in Reserve
	}
	return lease{}, err
}

// setDown records the outcome of a reservation (LaneSlots.down); s.mu is
// held. An answer (a lease, or the shared quota spent) clears it; a failure
// sets it, but not the end of ctx (a drain), which says nothing of Redis.
func (s *LaneSlots) setDown(ctx context.Context, err error) {
	if _, spent := errors.AsType[*drain.QuotaWait](err); err == nil || spent {
		s.answered, s.down = true, false
	} else if ctx.Err() == nil {
		s.down = true
	}
}
