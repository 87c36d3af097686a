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
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

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
		return s.client.Do(req)
	}
	cred, ok := s.auth.ready()
	if !ok {
		if wire := shaper.WireFrom(ctx); wire != nil {
			wire(time.Now())
		}
		req = req.WithContext(ctx) // without the trace: the wire is reported
		var err error
		if cred, err = s.auth.wait(ctx); err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
	}
	req.Header.Set(AuthorizationHeader, cred)
	resp, err := s.client.Do(req)
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
	retry := req.Clone(ctx) // the task's context: no second wire report
	if req.GetBody != nil {
		if retry.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
	retry.Header.Set(AuthorizationHeader, next)
	return s.client.Do(retry)
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

// ---------------------------------------------------------------------------
// bearer_file

// bearerFile serves "Bearer <contents of path>", re-read when the file or
// its directory changes (renames into place, Kubernetes' ..data swap) and
// after a 401.
type bearerFile struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[string] // the header value
	mu   sync.Mutex             // serialises reads of the file
	stop func()
}

func newBearerFile(path string, log *slog.Logger) (*bearerFile, error) {
	b := &bearerFile{path: path, log: log}
	if err := b.load(); err != nil {
		return nil, &ConfigProblem{Key: "auth.path", Message: err.Error()}
	}
	stop, err := watchFiles([]string{path}, func() {
		if err := b.load(); err != nil {
			log.Warn("sink kept its bearer token: the file did not re-read", "key", "sink.auth.path", "err", err)
		}
	})
	if err != nil {
		log.Warn("bearer token file not watched: it is re-read after a 401 only", "key", "sink.auth.path", "err", err)
	}
	b.stop = stop
	return b, nil
}

// load re-reads the file; on failure the last token stays.
func (b *bearerFile) load() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	tok, err := readBearer(b.path)
	if err != nil {
		return err
	}
	v := "Bearer " + tok
	b.cur.Store(&v)
	return nil
}

func (b *bearerFile) ready() (string, bool) { return *b.cur.Load(), true }

func (b *bearerFile) wait(context.Context) (string, error) { return *b.cur.Load(), nil }

// renew re-reads the file once; a token that did not change gives
// errSameCredential (a retry would be refused alike).
func (b *bearerFile) renew(_ context.Context, used string) (string, error) {
	if err := b.load(); err != nil {
		b.log.Warn("sink could not re-read its bearer token after a 401", "key", "sink.auth.path", "err", err)
	}
	if v := *b.cur.Load(); v != used {
		return v, nil
	}
	return "", errSameCredential
}

func (b *bearerFile) close() { b.stop() }

// ---------------------------------------------------------------------------
// oauth2

// oauth2Source keeps one token of the client credentials grant, fetched
// through golang.org/x/oauth2/clientcredentials, and refreshes it in the
// background before it expires (TokenRefreshAhead), so requests do not
// wait for the token endpoint. At most one token request runs at a time
// (call). x/oauth2's ReuseTokenSource is not used for the cache: it fetches
// on the request path, under a mutex that callers cannot leave when their
// context ends, so a slow endpoint would hold tasks past task.timeout.
type oauth2Source struct {
	conf   clientcredentials.Config
	base   context.Context // carries the token client; ended by close
	cancel context.CancelFunc
	client *http.Transport
	log    *slog.Logger
	now    func() time.Time

	mu       sync.Mutex
	tok      *oauth2.Token // nil: none, or dropped after a 401
	got      time.Time     // when tok arrived
	call     *tokenCall    // the token request in flight
	failedAt time.Time     // end of the last failed token request
	lastErr  error
	wg       sync.WaitGroup
}

// tokenCall is one token request; done is closed when tok or err is set.
type tokenCall struct {
	done chan struct{}
	tok  *oauth2.Token
	err  error
}

func newOAuth2(a AuthConfig, log *slog.Logger, now func() time.Time) *oauth2Source {
	params := url.Values{}
	for k, v := range a.Params {
		params.Set(k, v)
	}
	if a.Audience != "" {
		params.Set("audience", a.Audience)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	base, cancel := context.WithCancel(context.Background())
	base = context.WithValue(base, oauth2.HTTPClient, &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	})
	o := &oauth2Source{
		conf: clientcredentials.Config{ClientID: a.ClientID, ClientSecret: a.ClientSecret,
			TokenURL: a.TokenURL, Scopes: slices.Clone(a.Scopes), EndpointParams: params},
		base: base, cancel: cancel, client: tr, log: log, now: now,
	}
	o.mu.Lock()
	o.start() // the first token, before the first departure if it can
	o.mu.Unlock()
	return o
}

// margins returns, for the current token, how long before its expiry it is
// refreshed (ahead) and stops being sent (skew). Called with mu held.
func (o *oauth2Source) margins() (ahead, skew time.Duration) {
	life := o.tok.Expiry.Sub(o.got)
	return min(TokenRefreshAhead, life/10), min(TokenExpirySkew, life/20)
}

// usable reports whether the token may be sent at now, and whether it is due
// for its refresh. Called with mu held.
func (o *oauth2Source) usable(now time.Time) (ok, due bool) {
	if o.tok == nil || o.tok.AccessToken == "" {
		return false, true
	}
	if o.tok.Expiry.IsZero() {
		return true, false // no expires_in: until a 401
	}
	ahead, skew := o.margins()
	return now.Before(o.tok.Expiry.Add(-skew)), !now.Before(o.tok.Expiry.Add(-ahead))
}

func (o *oauth2Source) cooling(now time.Time) bool {
	return !o.failedAt.IsZero() && now.Sub(o.failedAt) < TokenRetryDelay
}

// start begins a token request unless one is running. Called with mu held.
func (o *oauth2Source) start() *tokenCall {
	if o.call != nil {
		return o.call
	}
	c := &tokenCall{done: make(chan struct{})}
	o.call = c
	o.wg.Add(1)
	go o.fetch(c)
	return c
}

func (o *oauth2Source) fetch(c *tokenCall) {
	defer o.wg.Done()
	ctx, cancel := context.WithTimeout(o.base, TokenFetchTimeout)
	tok, err := o.conf.Token(ctx)
	cancel()
	if err == nil && tok.AccessToken == "" {
		err = errors.New("the token endpoint answered no access_token")
	}
	if err != nil {
		err = tokenError(err)
	}
	o.mu.Lock()
	now := o.now()
	if err != nil {
		o.failedAt, o.lastErr = now, err
	} else {
		if !o.failedAt.IsZero() {
			o.log.Info("sink got a token again from its token endpoint", "key", "sink.auth.token_url")
		}
		o.tok, o.got, o.failedAt, o.lastErr = tok, now, time.Time{}, nil
	}
	o.call = nil
	c.tok, c.err = tok, err
	o.mu.Unlock()
	close(c.done)
	if err != nil && o.base.Err() == nil {
		o.log.Warn("sink could not get a token from its token endpoint", "key", "sink.auth.token_url", "err", err)
	}
}

func cred(t *oauth2.Token) string { return t.Type() + " " + t.AccessToken }

func (o *oauth2Source) ready() (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	ok, due := o.usable(now)
	if due && !o.cooling(now) {
		o.start()
	}
	if !ok {
		return "", false
	}
	return cred(o.tok), true
}

func (o *oauth2Source) wait(ctx context.Context) (string, error) {
	o.mu.Lock()
	now := o.now()
	if ok, _ := o.usable(now); ok {
		v := cred(o.tok)
		o.mu.Unlock()
		return v, nil
	}
	if o.call == nil && o.cooling(now) {
		err := o.lastErr
		o.mu.Unlock()
		return "", err
	}
	c := o.start()
	o.mu.Unlock()
	select {
	case <-c.done:
		if c.err != nil {
			return "", c.err
		}
		return cred(c.tok), nil
	case <-ctx.Done():
		return "", fmt.Errorf("waiting for a token: %w", ctx.Err())
	}
}

// renew drops the token used if it is still the current one (a 401 says it
// is no good), so that the next wait fetches a new one; a newer token that
// arrived meanwhile is used as it is.
func (o *oauth2Source) renew(ctx context.Context, used string) (string, error) {
	o.mu.Lock()
	if o.tok != nil && cred(o.tok) == used {
		o.tok = nil
		o.failedAt = time.Time{} // a 401 is worth one token request at once
	}
	o.mu.Unlock()
	return o.wait(ctx)
}

func (o *oauth2Source) close() {
	o.cancel()
	o.wg.Wait()
	o.client.CloseIdleConnections()
}

// tokenError describes a failed token request without the response body,
// the client's credentials or the token URL (which may carry some).
func tokenError(err error) error {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		msg := "token endpoint answered"
		if re.Response != nil {
			msg += " " + re.Response.Status
		}
		if re.ErrorCode != "" {
			msg += " (" + re.ErrorCode + ")"
		}
		return errors.New(msg)
	}
	return fmt.Errorf("token endpoint: %w", stripURL(err))
}

// startAuthTLS starts the sink's credential and TLS files (their watchers,
// the first token request). cfg has been checked.
func (s *HTTP) startAuthTLS(cfg HTTPConfig) error {
	if !cfg.TLS.IsZero() {
		u, _ := url.Parse(cfg.URL)
		r, err := newTLSReloader(cfg.TLS, u.Hostname(), s.logger)
		if err != nil {
			return err
		}
		s.tls = r
	}
	a, err := newAuthorizer(cfg.Auth, s.logger, s.now)
	if err != nil {
		s.stopAuthTLS()
		return err
	}
	s.auth = a
	return nil
}

// stopAuthTLS stops what startAuthTLS started.
func (s *HTTP) stopAuthTLS() {
	if s.tls != nil {
		s.tls.close()
	}
	if s.auth != nil {
		s.auth.close()
	}
}
