package sources

// FetchBytes bounds the bytes one pull request may bring (issue 15), 16 MiB:
// a lane asks for as many messages as its bucket has free slots, and with
// large messages that is more than the client and the server buffer for one
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
