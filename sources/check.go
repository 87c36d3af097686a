package sources

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrJetStreamNotEnabled is wrapped by [CheckJetStream] when the NATS server
// answers JetStream API requests with "no responders": it runs without
// JetStream (NOTES.md), which nats.go reports only as "nats: no responders
// available for request" on the first stream call.
var ErrJetStreamNotEnabled = errors.New("JetStream is not enabled on the NATS server")

// CheckJetStream asks the server for the account's JetStream information
// (one API request) and turns the answers of a server without JetStream into
// an error that says so: ErrJetStreamNotEnabled, naming shownURL (the
// server's URL with its credentials redacted, config.RedactURL) and the
// fix. An account without JetStream on a server that has it is reported as
// such; other errors are returned wrapped.
func CheckJetStream(ctx context.Context, js jetstream.JetStream, shownURL string) error {
	_, err := js.AccountInfo(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%w at %s: start it with -js (--jetstream), or set jetstream {} in its config; "+
			"or leave nats.url empty for the embedded server", ErrJetStreamNotEnabled, shownURL)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("JetStream is not enabled for this account on the NATS server at %s: enable it for the account (jetstream in the account's config): %w", shownURL, err)
	default:
		return fmt.Errorf("jetstream at %s: %w", shownURL, err)
	}
}
