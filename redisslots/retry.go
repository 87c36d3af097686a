package redisslots

import (
	"errors"
	"io"
	"net"
	"syscall"
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
func retryOnce(err error) bool {
	if isTimeout(err) {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}
