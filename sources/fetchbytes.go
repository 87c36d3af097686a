package sources

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FetchBytes bounds the bytes one pull request may bring (issue 15), 16 MiB:
// a lane asks for up to as many messages as its bucket has free slots
// (drain/fetch.go), and with large messages that is more than the client and the server buffer for one
// connection (nats.go's pending limit of a subscription and nats-server's
// max_pending of a client are 64 MiB by default). A pull of 300 messages of
// 512 KiB (150 MiB) lost messages on the way (74 of them came back only
// after the ack wait: section 5 of docs/BENCHMARKS.md,
// docs/performance.md); bounded by bytes, the lane pulls again at
// once for the slots still free (drain/fetch.go), so small messages are
// not affected (1,000 messages of 16 KiB fit in one pull).
const FetchBytes = 16 << 20

// pullMaxBytes is the byte budget of one pull: FetchBytes, or more when the
// server accepts messages larger than that. A message larger than a pull's
// budget is never delivered to it (the server answers 409 "Message Size
// Exceeds MaxBytes" and keeps it), so the budget holds the largest message
// the server takes (max_payload bounds headers and payload) plus its subject
// and framing.
func pullMaxBytes(maxPayload int64) int {
	const framing = 64 << 10
	return max(FetchBytes, int(maxPayload)+framing)
}

// needsByteBudget reports whether a pull of max messages needs the byte
// budget: only when its worst case, max messages of the server's
// max_payload, could pass nats.go's pending-bytes limit of a subscription
// (64 MiB), where the client drops messages and the server may drop the
// client (C38). Below that a pull is asked for by count alone, as before
// the budget: with a budget, the server ends every full pull with a 409
// Batch Completed, which on a 3-node cluster reached the client before its
// last messages (endedByBytes; TestClusterFailover).
func needsByteBudget(max int, maxPayload int64) bool {
	return int64(max)*maxPayload > nats.DefaultSubPendingBytesLimit
}

// endedByBytes reports whether err is the server's end of a pull with a
// byte budget that is no failure: all the messages asked for were sent with
// bytes to spare (409 Batch Completed), or the next message would not fit
// in what is left (409 Message Size Exceeds MaxBytes; it fits a fresh
// budget, pullMaxBytes). Taken as failures, they marked the source unbound
// and set the lane's fetch back-off after every full pull under a backlog
// (TestFetchFullBatchIsNoFailure).
func endedByBytes(err error) bool {
	return errors.Is(err, jetstream.ErrBatchCompleted) || errors.Is(err, jetstream.ErrMaxBytesExceeded)
}
