package sinks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// sink.auth kind oauth2: the client credentials grant (auth.go).

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
