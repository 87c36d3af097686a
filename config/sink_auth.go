package config

import (
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/shaper-dev/shaper/sinks"
)

// Values of sink.auth.kind (SPEC §4); the rules are sinks.CheckAuth's.
const (
	SinkAuthNone       = sinks.AuthNone       // no Authorization of the sink's own (default)
	SinkAuthBearerFile = sinks.AuthBearerFile // Bearer <contents of sink.auth.path>
	SinkAuthOAuth2     = sinks.AuthOAuth2     // OAuth 2.0 client credentials
)

// DefaultSinkAuthKind is the default sink.auth.kind.
const DefaultSinkAuthKind = SinkAuthNone

// SinkAuth is sink.auth of an http sink: the Authorization header the sink
// sets itself (sinks.AuthConfig). With a kind other than none,
// sink.headers may not set Authorization.
type SinkAuth struct {
	// Kind is none (default), bearer_file or oauth2.
	Kind string `mapstructure:"kind"`
	// Path is the file holding the bearer token (bearer_file); re-read when
	// it changes and after a 401.
	Path string `mapstructure:"path"`
	// TokenURL is the OAuth2 token endpoint (oauth2, required); may use
	// ${ENV}.
	TokenURL string `mapstructure:"token_url"`
	// ClientID identifies the client (oauth2, required); may use ${ENV}.
	ClientID string `mapstructure:"client_id"`
	// ClientSecret authenticates the client (oauth2, required): a secret,
	// give it as a ${ENV} reference; never logged or shown.
	ClientSecret string `mapstructure:"client_secret"`
	// Scopes are requested with the token (oauth2); optional.
	Scopes []string `mapstructure:"scopes"`
	// Audience is sent as the token request's audience (oauth2); optional;
	// may use ${ENV}.
	Audience string `mapstructure:"audience"`
	// Params are extra form values of the token request (oauth2), names
	// lower-cased by the loader; values may use ${ENV} and are shown
	// redacted when the name suggests a secret. Not settable from the
	// environment.
	Params map[string]string `mapstructure:"params"`
}

// SinkTLS is sink.tls of an http sink (sinks.TLSFiles): PEM files re-read
// when they change. Checked at load: they exist and parse, the key matches
// the certificate.
type SinkTLS struct {
	// CAFile is the CA bundle the downstream's certificate must chain to,
	// instead of the system's roots. Default "" (system roots).
	CAFile string `mapstructure:"ca_file"`
	// CertFile is the client certificate (mTLS); needs KeyFile.
	CertFile string `mapstructure:"cert_file"`
	// KeyFile is CertFile's private key; needs CertFile.
	KeyFile string `mapstructure:"key_file"`
}

// HTTPAuth returns a's keys for sinks.NewHTTP.
func (a SinkAuth) HTTPAuth() sinks.AuthConfig {
	return sinks.AuthConfig{Kind: a.Kind, Path: a.Path, TokenURL: a.TokenURL, ClientID: a.ClientID,
		ClientSecret: a.ClientSecret, Scopes: slices.Clone(a.Scopes), Audience: a.Audience, Params: maps.Clone(a.Params)}
}

// HTTPTLS returns t's keys for sinks.NewHTTP.
func (t SinkTLS) HTTPTLS() sinks.TLSFiles {
	return sinks.TLSFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile}
}

// expandAuth expands the ${ENV} references of sink.auth (prefix ends with
// "sink.").
func expandAuth(prefix string, a *SinkAuth, expand func(key string, s *string)) {
	expand(prefix+"auth.token_url", &a.TokenURL)
	expand(prefix+"auth.client_id", &a.ClientID)
	expand(prefix+"auth.client_secret", &a.ClientSecret)
	expand(prefix+"auth.audience", &a.Audience)
	if a.Params != nil {
		params := make(map[string]string, len(a.Params))
		for k, val := range a.Params {
			expand(prefix+"auth.params."+k, &val)
			params[k] = val
		}
		a.Params = params
	}
}

// redactedAuth returns a copy of a safe to show: client_secret as its ${ENV}
// reference or [REDACTED], the token URL masked, params like headers.
func (c *Config) redactedAuth(prefix string, a SinkAuth) SinkAuth {
	r := a
	r.Scopes = slices.Clone(a.Scopes)
	if tmpl, ok := c.templates[prefix+"auth.client_secret"]; ok {
		r.ClientSecret = tmpl
	} else if a.ClientSecret != "" {
		r.ClientSecret = redactedValue
	}
	r.TokenURL = c.shownRaw(prefix+"auth.token_url", a.TokenURL)
	if tmpl, ok := c.templates[prefix+"auth.client_id"]; ok {
		r.ClientID = tmpl
	}
	if tmpl, ok := c.templates[prefix+"auth.audience"]; ok {
		r.Audience = tmpl
	}
	if a.Params != nil {
		r.Params = make(map[string]string, len(a.Params))
		for k, val := range a.Params {
			switch tmpl, ok := c.templates[prefix+"auth.params."+k]; {
			case ok:
				r.Params[k] = tmpl
			case sensitiveHeader(k) || strings.Contains(k, "assertion"):
				r.Params[k] = redactedValue
			default:
				r.Params[k] = val
			}
		}
	}
	return r
}

// sinkAuthTLS checks sink.auth and sink.tls of an http sink with the
// sink's own rules (sinks.CheckAuth, sinks.CheckTLS: SPEC §7, the HTTP
// sink's checks live in sinks), under their full key paths. A client_secret
// written in the file instead of a ${ENV} reference is a warning.
func (v *validator) sinkAuthTLS(name string, s Sink) {
	prefix := "downstreams." + name + ".sink."
	// Each block on its own: an unset ${NAME} in sink.auth (a
	// client_secret) must not hide the problems of sink.tls, nor the
	// reverse (found by a new-user pass).
	var ps []*sinks.ConfigProblem
	if !v.p.skip(prefix + "auth") {
		ps = append(ps, sinks.CheckAuth(s.Auth.HTTPAuth(), s.Headers)...)
	}
	if !v.p.skip(prefix + "tls") {
		u := s.URL
		if v.p.skip(prefix + "url") {
			u = "" // its ${NAME} text: only the files are judged
		}
		ps = append(ps, sinks.CheckTLS(s.TLS.HTTPTLS(), u)...)
	}
	for _, p := range ps {
		v.check(false, prefix+p.Key, "%s", p.Message)
	}
	v.urlUserInfoUnused(prefix, s)
	if _, ok := v.c.templates[prefix+"auth.client_secret"]; !ok && s.Auth.ClientSecret != "" {
		v.warn(prefix+"auth.client_secret", "is written in the file: give it as a ${ENV} reference so the file holds no secret")
	}
}

// sinkAuthIgnored warns when sink.auth or sink.tls is set for a sink kind
// other than http, which does not use them.
func (v *validator) sinkAuthIgnored(name string, s Sink) {
	if s.Kind == SinkHTTP || s.Kind == "" {
		return
	}
	prefix := "downstreams." + name + ".sink."
	if s.Auth.Kind != "" && s.Auth.Kind != SinkAuthNone {
		v.warn(prefix+"auth", "ignored for sink kind %s", s.Kind)
	}
	if s.TLS != (SinkTLS{}) {
		v.warn(prefix+"tls", "ignored for sink kind %s", s.Kind)
	}
}

// urlUserInfoUnused warns when sink.url carries user info (basic auth)
// while sink.auth or sink.headers sets Authorization: net/http then sends
// the header and drops the user info without a word (found by a new-user
// pass). The warning names neither the user nor the password.
func (v *validator) urlUserInfoUnused(prefix string, s Sink) {
	if v.p.skip(prefix + "url") {
		return
	}
	u, err := url.Parse(s.URL)
	if err != nil || u.User == nil {
		return
	}
	if s.Auth.Kind != "" && s.Auth.Kind != SinkAuthNone {
		v.warn(prefix+"url", "its user info (basic auth) is not sent: sink.auth (kind %s) sets Authorization", s.Auth.Kind)
		return
	}
	for h := range s.Headers {
		if strings.EqualFold(h, "Authorization") {
			v.warn(prefix+"url", "its user info (basic auth) is not sent: sink.headers sets Authorization")
			return
		}
	}
}
