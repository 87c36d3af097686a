package sinks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SigningStandardWebhooks is the value of sink.signing.scheme that signs
// each request the Standard Webhooks way (standardwebhooks.com, symmetric
// "v1" signatures): HMAC-SHA256 over "<webhook-id>.<webhook-timestamp>.<body>".
const SigningStandardWebhooks = "standard-webhooks"

// Headers of a request signed with [SigningStandardWebhooks].
const (
	// WebhookIDHeader carries [shaper.Message.Key], the idempotency key of
	// SPEC G8: the same on every redelivery, so a receiver that dedupes by
	// webhook-id dedupes by the key.
	WebhookIDHeader = "Webhook-Id"
	// WebhookTimestampHeader carries the Unix time in seconds at which the
	// request was signed, just before it was sent (a retry is signed anew).
	WebhookTimestampHeader = "Webhook-Timestamp"
	// WebhookSignatureHeader carries "v1,<base64 signature>", one per
	// configured secret, separated by spaces (a receiver accepts the
	// request when any of them verifies: that is how secrets rotate).
	WebhookSignatureHeader = "Webhook-Signature"
)

// WebhookSecretPrefix starts a Standard Webhooks secret: "whsec_" followed
// by the key in standard base64.
const WebhookSecretPrefix = "whsec_"

// SigningConfig configures the signing of an HTTP sink's requests: the keys
// downstreams.<lane>.sink.signing, after ${ENV} expansion.
type SigningConfig struct {
	// Scheme is "" (no signing, the default) or [SigningStandardWebhooks].
	Scheme string
	// Secrets are the signing secrets, "whsec_" + base64 ([WebhookSecretPrefix];
	// the prefix may be left out, as the scheme's own libraries allow). At
	// least one when Scheme is set. Each request carries one signature per
	// secret: to rotate, add the new secret, move the receivers to it, then
	// remove the old one. Secrets never appear in errors or logs.
	Secrets []string
}

// ParseWebhookSecret decodes a Standard Webhooks secret into its key: the
// standard base64 (with padding) after the optional "whsec_" prefix. The
// error says what is wrong without quoting the secret.
func ParseWebhookSecret(secret string) ([]byte, error) {
	b64 := strings.TrimPrefix(secret, WebhookSecretPrefix)
	if b64 == "" {
		return nil, errors.New("empty: want " + WebhookSecretPrefix + " followed by the key in base64")
	}
	key, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		var bad base64.CorruptInputError
		if errors.As(err, &bad) {
			where := "of the key"
			if strings.HasPrefix(secret, WebhookSecretPrefix) {
				where = "after the prefix"
			}
			return nil, fmt.Errorf("not %s followed by standard base64 (bad input at byte %d %s)", WebhookSecretPrefix, int64(bad), where)
		}
		return nil, fmt.Errorf("not %s followed by standard base64", WebhookSecretPrefix)
	}
	if len(key) == 0 {
		return nil, errors.New("the key is empty")
	}
	return key, nil
}

// signer signs requests with every configured key. A nil *signer signs
// nothing.
type signer struct {
	keys [][]byte
}

// newSigner returns the signer of cfg, nil when cfg.Scheme is "". Errors are
// prefixed with their key relative to the sink (signing.scheme,
// signing.secrets[i]) and never quote a secret.
func newSigner(cfg SigningConfig) (*signer, []error) {
	switch cfg.Scheme {
	case "":
		if len(cfg.Secrets) > 0 {
			return nil, []error{errors.New("signing.scheme: required when signing.secrets are set (standard-webhooks)")}
		}
		return nil, nil
	case SigningStandardWebhooks:
	default:
		return nil, []error{fmt.Errorf("signing.scheme %q: unknown: want %s (or \"\" for none)", cfg.Scheme, SigningStandardWebhooks)}
	}
	if len(cfg.Secrets) == 0 {
		return nil, []error{errors.New("signing.secrets: at least one secret is required for scheme " + SigningStandardWebhooks)}
	}
	s := &signer{}
	var errs []error
	for i, secret := range cfg.Secrets {
		key, err := ParseWebhookSecret(secret)
		if err != nil {
			errs = append(errs, fmt.Errorf("signing.secrets[%d]: %w", i, err))
			continue
		}
		s.keys = append(s.keys, key)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return s, nil
}

// reservedIn reports, as errors keyed headers.<name>, the configured
// headers that the signature headers would overwrite.
func (s *signer) reservedIn(headers map[string]string) []error {
	if s == nil {
		return nil
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(headers)) {
		if IsSignatureHeader(name) {
			errs = append(errs, fmt.Errorf("headers.%s: reserved: sink.signing sets this header", name))
		}
	}
	return errs
}

// IsSignatureHeader reports whether name (any case) is one of the headers
// signing sets, which sink.headers may not set while signing is on.
func IsSignatureHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case WebhookIDHeader, WebhookTimestampHeader, WebhookSignatureHeader:
		return true
	}
	return false
}

// sign sets the Standard Webhooks headers of a request with id, signed at
// now, carrying body.
func (s *signer) sign(h http.Header, id string, now time.Time, body []byte) {
	if s == nil {
		return
	}
	ts := strconv.FormatInt(now.Unix(), 10)
	sigs := make([]string, len(s.keys))
	for i, key := range s.keys {
		sigs[i] = "v1," + base64.StdEncoding.EncodeToString(webhookMAC(key, id, ts, body))
	}
	h.Set(WebhookIDHeader, id)
	h.Set(WebhookTimestampHeader, ts)
	h.Set(WebhookSignatureHeader, strings.Join(sigs, " "))
}

// webhookMAC is HMAC-SHA256 with key over "<id>.<timestamp>.<body>".
func webhookMAC(key []byte, id, ts string, body []byte) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}

// SignWebhook returns the value of the webhook-signature header for one
// secret: "v1,<base64 HMAC-SHA256 over id.timestamp.body>", the signature
// the sink sends (exported for tests and for receivers written in Go).
func SignWebhook(secret, id string, timestamp time.Time, body []byte) (string, error) {
	key, err := ParseWebhookSecret(secret)
	if err != nil {
		return "", err
	}
	return "v1," + base64.StdEncoding.EncodeToString(webhookMAC(key, id, strconv.FormatInt(timestamp.Unix(), 10), body)), nil
}
