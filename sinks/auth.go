package sinks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Values of AuthConfig.Kind (sink.auth.kind, SPEC §4).
const (
	// AuthNone sends no Authorization header of the sink's own. "" means
	// the same.
	AuthNone = "none"
	// AuthBearerFile sends "Authorization: Bearer <file contents, trimmed>",
	// re-read when the file changes (a Kubernetes projected token, a Vault
	// agent's sink file).
	AuthBearerFile = "bearer_file"
	// AuthOAuth2 sends a token of the OAuth 2.0 client credentials grant
	// (RFC 6749 §4.4) from AuthConfig.TokenURL.
	AuthOAuth2 = "oauth2"
)

// AuthorizationHeader is the header the sink sets itself when
// AuthConfig.Kind is not none; HTTPConfig.Headers may not set it then.
const AuthorizationHeader = "Authorization"

// Timing of OAuth2 tokens. The margins are shares of a token's lifetime
// (expires_in) so that short-lived tokens work too: Go's x/oauth2 default of
// 10 s before expiry would fetch a new token for every request when tokens
// live a few seconds (NOTES.md).
const (
	// TokenRefreshAhead is the most before its expiry that a token is
	// refreshed in the background, at most a tenth of its lifetime (a token
	// of 2 s is refreshed 200 ms before it expires, one of an hour 10 s
	// before). Requests keep using the old token meanwhile.
	TokenRefreshAhead = 10 * time.Second
	// TokenExpirySkew is the most before its expiry that a token stops
	// being sent, at most a twentieth of its lifetime (for the time the
	// request travels and clock skew): past it a request waits for a new
	// token.
	TokenExpirySkew = time.Second
	// TokenRetryDelay is how long after a failed token request no new one is
	// made; requests without a usable token fail at once meanwhile (a
	// retryable failure, SPEC §3 Retries), so a token endpoint that is down
	// is not called by every task.
	TokenRetryDelay = time.Second
	// TokenFetchTimeout bounds one token request. A task waits for it at
	// most until its own task.timeout.
	TokenFetchTimeout = 30 * time.Second
)

// AuthConfig is the sink.auth key of an HTTP sink (SPEC §4), after ${ENV}
// expansion. Check it with [CheckAuth]. Kind selects which fields apply:
// Path for bearer_file; TokenURL, ClientID, ClientSecret, Scopes, Audience
// and Params for oauth2.
type AuthConfig struct {
	// Kind is AuthNone ("" too), AuthBearerFile or AuthOAuth2.
	Kind string
	// Path is the file holding the bearer token (bearer_file). Its contents,
	// trimmed of white space, are the token; they never appear in errors or
	// logs.
	Path string
	// TokenURL is the http or https URL of the token endpoint (oauth2).
	TokenURL string
	// ClientID and ClientSecret authenticate the client to the token
	// endpoint (HTTP Basic, RFC 6749 §2.3.1, or form values when the
	// endpoint refuses Basic; found once per sink). ClientSecret is a
	// secret: it never appears in errors or logs.
	ClientID, ClientSecret string
	// Scopes are sent as the space-separated scope value; optional.
	Scopes []string
	// Audience, when set, is sent as the audience form value (Auth0, Okta
	// and others want one).
	Audience string
	// Params are extra form values of the token request (resource, …);
	// grant_type, scope, client_id, client_secret and audience are set by
	// the sink and may not be given here.
	Params map[string]string
}

// ConfigProblem is one problem of an HTTP sink's configuration, found by
// [CheckAuth] and [CheckTLS] (and so by [NewHTTP]). Config validation adds
// "downstreams.<lane>.sink." to Key.
type ConfigProblem struct {
	// Key is the key path relative to the sink: "auth.token_url",
	// "tls.key_file", "headers.authorization".
	Key string
	// Message says what is wrong; it never quotes a secret or a file's
	// contents.
	Message string
}

// Error formats p as "<key>: <message>".
func (p *ConfigProblem) Error() string { return p.Key + ": " + p.Message }

// reservedParams are the token request's form values the sink (or x/oauth2)
// sets itself.
var reservedParams = []string{"grant_type", "scope", "client_id", "client_secret", "audience"}

// CheckAuth returns the problems of a sink.auth configuration with the
// sink's headers (an Authorization header is the sink's own when Kind is
// not none). For bearer_file it reads the file: it must exist and hold a
// non-empty token that HTTP can carry. It makes no network call.
func CheckAuth(a AuthConfig, headers map[string]string) []*ConfigProblem {
	var ps []*ConfigProblem
	add := func(key, format string, args ...any) {
		ps = append(ps, &ConfigProblem{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	bearer := map[string]bool{"auth.path": a.Path != ""}
	oauth := map[string]bool{"auth.token_url": a.TokenURL != "", "auth.client_id": a.ClientID != "",
		"auth.client_secret": a.ClientSecret != "", "auth.scopes": len(a.Scopes) > 0,
		"auth.audience": a.Audience != "", "auth.params": len(a.Params) > 0}
	unused := func(keys map[string]bool) {
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			if keys[k] {
				kind := AuthOAuth2
				if k == "auth.path" {
					kind = AuthBearerFile
				}
				add(k, "only applies to auth.kind %s", kind)
			}
		}
	}
	switch a.Kind {
	case "", AuthNone:
		unused(bearer)
		unused(oauth)
		return ps
	case AuthBearerFile:
		unused(oauth)
		if a.Path == "" {
			add("auth.path", "required for auth.kind bearer_file (the file holding the token)")
		} else if _, err := readBearer(a.Path); err != nil {
			add("auth.path", "%v", err)
		}
	case AuthOAuth2:
		unused(bearer)
		if a.TokenURL == "" {
			add("auth.token_url", "required for auth.kind oauth2 (the token endpoint's URL)")
		} else if u, err := url.Parse(a.TokenURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add("auth.token_url", "must be an absolute http or https URL")
		}
		if a.ClientID == "" {
			add("auth.client_id", "required for auth.kind oauth2")
		}
		if a.ClientSecret == "" {
			add("auth.client_secret", "required for auth.kind oauth2 (give it as a ${ENV} reference)")
		}
		for i, s := range a.Scopes {
			if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == '"' || r == '\\' }) {
				add(fmt.Sprintf("auth.scopes[%d]", i), "%q is not a scope: no spaces, quotes or control characters (RFC 6749 §3.3)", s)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(a.Params)) {
			if slices.Contains(reservedParams, strings.ToLower(name)) {
				add("auth.params."+name, "reserved: the sink sets %s itself (use auth.client_id, auth.scopes or auth.audience)", name)
			}
		}
	default:
		add("auth.kind", "must be none, bearer_file or oauth2, got %q", a.Kind)
		return ps
	}
	for name := range headers {
		if http.CanonicalHeaderKey(name) == AuthorizationHeader {
			add("headers."+name, "reserved: sink.auth (kind %s) sets Authorization itself", a.Kind)
		}
	}
	return ps
}

// readBearer reads a bearer token file: its contents trimmed of white
// space. Errors name the file, never its contents.
func readBearer(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return "", fmt.Errorf("cannot read %q: %v", path, pe.Err)
		}
		return "", fmt.Errorf("cannot read %q: %v", path, err)
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case tok == "":
		return "", fmt.Errorf("%q is empty: want the bearer token", path)
	case !validHeaderValue(tok) || strings.ContainsAny(tok, "\r\n"):
		return "", fmt.Errorf("%q holds characters a header cannot carry (control characters or several lines)", path)
	}
	return tok, nil
}

// authorizer gives the Authorization header value of a request.
type authorizer interface {
	// ready returns a value to send now, without waiting, and reports
	// whether there is one.
	ready() (string, bool)
	// wait returns a value once one is available, or an error (a token
	// endpoint that failed, the end of ctx).
	wait(ctx context.Context) (string, error)
	// renew is called after the downstream answered 401 to a request that
	// carried used: it drops used and returns the value to retry with, or
	// an error (errSameCredential when there is nothing new to try).
	renew(ctx context.Context, used string) (string, error)
	close()
}

// errSameCredential is renew's answer when a retry could only repeat the
// rejected credential: the 401 stands.
var errSameCredential = errors.New("no new credential after 401")

// newAuthorizer returns the authorizer of a, or nil for kind none.
func newAuthorizer(a AuthConfig, log *slog.Logger, now func() time.Time) (authorizer, error) {
	switch a.Kind {
	case AuthBearerFile:
		return newBearerFile(a.Path, log)
	case AuthOAuth2:
		return newOAuth2(a, log, now), nil
	}
	return nil, nil
}

// do sends req with the sink's credential (when sink.auth is set), and on a
// 401 renews the credential once and sends the request once more, in the
// same task: no second departure (SPEC §3 Retries counts the task as one
// attempt). ctx is the task's context; req carries it, possibly with the
// wire trace of Send. When no credential is ready, the lane is told the
// request is on its way at once (shaper.WithWire), so that the wait for a
// token never holds the next departure (SPEC G5): the sink call only takes
// longer. A credential that cannot be had is a retryable failure.
func (s *HTTP) do(ctx context.Context, req *http.Request) (*http.Response, error) {
	if s.auth == nil {
		return s.send(req)
	}
	cred, ok := s.auth.ready()
	if !ok {
		// The wait for a credential must not hold the next departures
		// (G5). A gated lane is told the request yields: the next ones
		// leave, and this one waits at its gate, before its write, for a
		// departure of its own (drain/gate.go), so that the requests that
		// waited for the token do not reach the downstream together when
		// it comes (G1; TestOAuth2FirstTokenKeepsSpacing). Otherwise the
		// lane is told the request is on its way, and the trace comes off
		// (the wire is reported).
		if gate := shaper.GateFrom(ctx); gate != nil {
			gate.Yield()
		} else {
			if wire := shaper.WireFrom(ctx); wire != nil {
				wire(time.Now(), false)
			}
			req = req.WithContext(ctx)
		}
		var err error
		if cred, err = s.auth.wait(ctx); err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
	}
	req.Header.Set(AuthorizationHeader, cred)
	resp, err := s.send(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	next, rerr := s.auth.renew(ctx, cred)
	if errors.Is(rerr, errSameCredential) {
		return resp, nil // classified: a 401 is not retryable
	}
	drainBody(resp)
	if rerr != nil {
		return nil, fmt.Errorf("auth: after 401: %w", rerr)
	}
	// A gated lane's retry waits at its gate for a departure of its own
	// (its first write was reported: the trace yields), so that the
	// retries after a revoked token do not reach the downstream together
	// (found by review: 6 within 0.9 ms at 20/s). Otherwise the task's
	// context: no second wire report of the same departure.
	rctx := ctx
	if shaper.GateFrom(ctx) != nil {
		rctx = req.Context()
	}
	retry := req.Clone(rctx)
	if req.GetBody != nil {
		if retry.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
	retry.Header.Set(AuthorizationHeader, next)
	return s.send(retry)
}

// drainBody reads what is left of a response (up to maxDrain) and closes
// it, so the connection can be reused.
func drainBody(resp *http.Response) {
	buf := make([]byte, 4096)
	for n := 0; n < maxDrain; {
		k, err := resp.Body.Read(buf)
		n += k
		if err != nil {
			break
		}
	}
	_ = resp.Body.Close()
}

// fileDebounce is how long after the last change of a token, certificate
// or key file the sink re-reads it (internal/filewatch): a rotation that
// writes a certificate and then its key is one change.
const fileDebounce = 100 * time.Millisecond
