package config

import (
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/shaper-dev/shaper/sinks"
)

// SinkSigning is sink.signing: how an http sink signs its requests.
type SinkSigning struct {
	// Scheme is "" (default: no signing) or SigningStandardWebhooks.
	Scheme string `mapstructure:"scheme"`
	// Secrets are the signing secrets, each "whsec_" + base64 of the key;
	// secrets: give them as ${ENV} references. At least one when Scheme is
	// set; each request carries one signature per secret, so a receiver
	// keeps verifying while secrets rotate (add the new one, move the
	// receivers, remove the old one). Never logged or shown.
	Secrets []string `mapstructure:"secrets"`
}

// SigningStandardWebhooks is the sink.signing.scheme of Standard Webhooks
// (webhook-id, webhook-timestamp, webhook-signature: HMAC-SHA256).
const SigningStandardWebhooks = sinks.SigningStandardWebhooks

// signing checks sink.signing of a lane with the sink's own rules
// (sinks.ParseWebhookSecret): a known scheme, at least one secret, each
// decoding to a key; a scheme only for sink kind http; no configured header
// that the signature headers would overwrite. Messages never quote a secret.
func (v *validator) signing(name string, s Sink) {
	k := func(rel string) string { return "downstreams." + name + ".sink.signing." + rel }
	sg := s.Signing
	if sg.Scheme == "" && len(sg.Secrets) == 0 {
		return
	}
	if s.Kind != SinkHTTP {
		if s.Kind == SinkNATS || s.Kind == SinkLog {
			v.warn(k("scheme"), "ignored for sink kind %s (only http requests are signed)", s.Kind)
		}
		return
	}
	switch sg.Scheme {
	case SigningStandardWebhooks:
	case "":
		v.check(false, k("scheme"), "required when signing.secrets are set: want %s", SigningStandardWebhooks)
		return
	default:
		v.check(false, k("scheme"), "must be %s (or \"\" for none), got %q", SigningStandardWebhooks, sg.Scheme)
		return
	}
	v.check(len(sg.Secrets) > 0, k("secrets"), "at least one secret is required for scheme %s (whsec_ + base64, from ${ENV})", sg.Scheme)
	for i, secret := range sg.Secrets {
		key := fmt.Sprintf("%s[%d]", k("secrets"), i)
		if v.p.skip(key) {
			continue
		}
		raw, err := sinks.ParseWebhookSecret(secret)
		if err != nil {
			v.check(false, key, "%s", err) // never the secret
			continue
		}
		if len(raw) < 24 {
			v.warn(key, "the key is %d bytes; Standard Webhooks recommends 24 to 64 random bytes", len(raw))
		}
	}
	for _, h := range slices.Sorted(maps.Keys(s.Headers)) {
		if sinks.IsSignatureHeader(h) {
			v.check(false, "downstreams."+name+".sink.headers."+h, "%q is reserved: sink.signing sets it", http.CanonicalHeaderKey(h))
		}
	}
}

// expandSigning expands ${ENV} references in the signing secrets of every
// lane (expandSecrets).
func expandSigning(c *Config, expand func(key string, s *string)) {
	for name, l := range c.Downstreams {
		if len(l.Sink.Signing.Secrets) == 0 {
			continue
		}
		secrets := slices.Clone(l.Sink.Signing.Secrets)
		for i := range secrets {
			expand(fmt.Sprintf("downstreams.%s.sink.signing.secrets[%d]", name, i), &secrets[i])
		}
		l.Sink.Signing.Secrets = secrets
		c.Downstreams[name] = l
	}
}

// redactedSigning returns the secrets as Redacted shows them: each one's
// ${ENV} reference, or [REDACTED].
func (c *Config) redactedSigning(lane string, secrets []string) []string {
	if secrets == nil {
		return nil
	}
	out := make([]string, len(secrets))
	for i := range secrets {
		if tmpl, ok := c.templates[fmt.Sprintf("downstreams.%s.sink.signing.secrets[%d]", lane, i)]; ok {
			out[i] = tmpl
		} else {
			out[i] = redactedValue
		}
	}
	return out
}
