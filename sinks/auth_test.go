package sinks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/shaper/shapertest"
	"github.com/shaper-dev/shaper/sinks"
)

const (
	testClientID     = "shaper-client"
	testClientSecret = "s3cret-do-not-print"
)

// tokenServer is an OAuth2 token endpoint of the client credentials grant
// (RFC 6749 §4.4) that issues tok-1, tok-2, … living lifetime each, and
// remembers every token it issued with its expiry, so a downstream can
// check the tokens it is sent.
type tokenServer struct {
	srv      *httptest.Server
	lifetime time.Duration
	calls    atomic.Int64
	down     atomic.Bool  // answer 503
	delay    atomic.Int64 // nanoseconds to wait before answering

	mu     sync.Mutex
	issued map[string]time.Time // token -> expiry
	forms  []map[string][]string
}

func newTokenServer(t *testing.T, lifetime time.Duration) *tokenServer {
	t.Helper()
	ts := &tokenServer{lifetime: lifetime, issued: map[string]time.Time{}}
	ts.srv = httptest.NewServer(http.HandlerFunc(ts.serve))
	t.Cleanup(ts.srv.Close)
	return ts
}

func (ts *tokenServer) url() string { return ts.srv.URL + "/oauth/token" }

func (ts *tokenServer) serve(w http.ResponseWriter, r *http.Request) {
	n := ts.calls.Add(1)
	formErr := r.ParseForm() // the whole body: a client that goes away now ends r.Context()
	if d := time.Duration(ts.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	if ts.down.Load() {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	id, secret, ok := r.BasicAuth()
	if err := formErr; err != nil || !ok || id != testClientID || secret != testClientSecret ||
		r.PostForm.Get("grant_type") != "client_credentials" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":"invalid_client","error_description":"echo %s"}`, secret)
		return
	}
	tok := fmt.Sprintf("tok-%d", n)
	ts.mu.Lock()
	ts.issued[tok] = time.Now().Add(ts.lifetime)
	ts.forms = append(ts.forms, r.PostForm)
	ts.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "bearer",
		"expires_in": int(ts.lifetime / time.Second)})
}

// valid reports whether header carries a token this server issued that has
// not expired at.
func (ts *tokenServer) valid(header string, at time.Time) bool {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		return false
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	exp, ok := ts.issued[tok]
	return ok && at.Before(exp)
}

// checkingDownstream answers 204 to requests carrying a valid token of ts
// and 401 to the others, and counts both.
type checkingDownstream struct {
	srv    *httptest.Server
	ts     *tokenServer
	reject func(auth string) bool // also 401, before the check (optional)

	mu       sync.Mutex
	ok, bad  int
	auths    []string
	keys     map[string]int
	arrivals []time.Time
}

func newCheckingDownstream(t *testing.T, ts *tokenServer) *checkingDownstream {
	t.Helper()
	d := &checkingDownstream{ts: ts, keys: map[string]int{}}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		auth := r.Header.Get("Authorization")
		good := (d.reject == nil || !d.reject(auth)) && ts.valid(auth, now)
		d.mu.Lock()
		d.auths = append(d.auths, auth)
		if good {
			d.ok++
			d.keys[r.Header.Get("Idempotency-Key")]++
			d.arrivals = append(d.arrivals, now)
		} else {
			d.bad++
		}
		d.mu.Unlock()
		if !good {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *checkingDownstream) counts() (ok, bad int, auths []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ok, d.bad, append([]string(nil), d.auths...)
}

func oauthConfig(ts *tokenServer) sinks.AuthConfig {
	return sinks.AuthConfig{Kind: sinks.AuthOAuth2, TokenURL: ts.url(), ClientID: testClientID,
		ClientSecret: testClientSecret, Scopes: []string{"callbacks:write", "refunds"},
		Audience: "https://psp.example", Params: map[string]string{"resource": "urn:psp"}}
}

// wireCount is what a wireCounter's function saw: its calls, the exact
// ones among them (shaper.WithWire), and when the first came (Unix ns).
type wireCount struct{ n, exact, first atomic.Int64 }

// wireCounter returns a context whose shaper.WithWire function counts its
// calls into the returned wireCount.
func wireCounter(ctx context.Context) (context.Context, *wireCount) {
	c := &wireCount{}
	return shaper.WithWire(ctx, func(at time.Time, exact bool) {
		if c.n.Add(1) == 1 {
			c.first.Store(at.UnixNano())
		}
		if exact {
			c.exact.Add(1)
		}
	}), c
}

// TestOAuth2TokenRequestAndReuse: the sink gets a token by the client
// credentials grant (Basic client authentication, grant_type, scope,
// audience and the extra params) and sends it as a Bearer token on every
// request; 50 requests use one token.
func TestOAuth2TokenRequestAndReuse(t *testing.T) {
	ts := newTokenServer(t, time.Hour)
	down := newCheckingDownstream(t, ts)
	s := newHTTP(t, sinks.HTTPConfig{URL: down.srv.URL, Auth: oauthConfig(ts)})
	for range 50 {
		if err := send(t, s, testMessage()); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	ok, bad, _ := down.counts()
	if ok != 50 || bad != 0 {
		t.Errorf("downstream: %d accepted, %d refused; want 50 and 0", ok, bad)
	}
	if c := ts.calls.Load(); c != 1 {
		t.Errorf("token endpoint called %d times for 50 requests with a token of an hour; want 1", c)
	}
	ts.mu.Lock()
	form := ts.forms[0]
	ts.mu.Unlock()
	for k, want := range map[string]string{"scope": "callbacks:write refunds", "audience": "https://psp.example", "resource": "urn:psp"} {
		if got := strings.Join(form[k], ","); got != want {
			t.Errorf("token request %s = %q, want %q", k, got, want)
		}
	}
}

// TestOAuth2RetryOnce401: a 401 from the downstream drops the token; the
// same Send gets a new one and sends the request once more: two token
// requests, two requests downstream, one wire report, success.
func TestOAuth2RetryOnce401(t *testing.T) {
	ts := newTokenServer(t, time.Hour)
	down := newCheckingDownstream(t, ts)
	down.reject = func(auth string) bool { return auth == "Bearer tok-1" } // revoked
	s := newHTTP(t, sinks.HTTPConfig{URL: down.srv.URL, Auth: oauthConfig(ts)})
	waitTokenCalls(t, ts, 1) // the first token, fetched at NewHTTP

	ctx, wires := wireCounter(context.Background())
	if err := s.Send(ctx, testMessage()); err != nil {
		t.Fatalf("send after a 401: %v, want the retry to succeed", err)
	}
	ok, bad, auths := down.counts()
	if ok != 1 || bad != 1 {
		t.Errorf("downstream: %d accepted, %d refused (%q); want 1 and 1", ok, bad, auths)
	}
	if c := ts.calls.Load(); c != 2 {
		t.Errorf("token endpoint called %d times; want 2 (one refresh after the 401)", c)
	}
	if n := wires.n.Load(); n != 1 {
		t.Errorf("%d wire reports for one Send; want 1 (the retry is no second departure)", n)
	}

	// A 401 to the new token as well: no third request, a permanent error.
	down.reject = func(string) bool { return true }
	err := send(t, s, testMessage())
	var se *shaper.SinkError
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || !se.Permanent {
		t.Errorf("send refused twice: %v; want a permanent 401 SinkError", err)
	}
	if _, bad, _ := down.counts(); bad != 3 {
		t.Errorf("downstream refused %d requests in all; want 3 (one retry per Send)", bad)
	}
}

// TestOAuth2TokenEndpointFailures: a token endpoint that is down or slower
// than the task's deadline is a retryable failure with Status 0, reached
// within the deadline; the lane is told at once that the request left (the
// wait for a token never holds the next departure); no secret in errors.
func TestOAuth2TokenEndpointFailures(t *testing.T) {
	t.Run("slow", func(t *testing.T) {
		ts := newTokenServer(t, time.Hour)
		ts.delay.Store(int64(3 * time.Second))
		down := newCheckingDownstream(t, ts)
		s := newHTTP(t, sinks.HTTPConfig{URL: down.srv.URL, Auth: oauthConfig(ts)})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		ctx, wires := wireCounter(ctx)
		start := time.Now()
		err := s.Send(ctx, testMessage())
		took := time.Since(start)
		var se *shaper.SinkError
		if !errors.As(err, &se) || se.Status != 0 || se.Permanent || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("send with a token endpoint slower than the deadline: %v; want a retryable SinkError, Status 0, DeadlineExceeded", err)
		}
		if took > time.Second {
			t.Errorf("send took %v under a deadline of 300ms", took)
		}
		if wires.n.Load() != 1 || time.Unix(0, wires.first.Load()).Sub(start) > 50*time.Millisecond {
			t.Errorf("wire reports %d, first %v after the call; want 1 at once", wires.n.Load(), time.Unix(0, wires.first.Load()).Sub(start))
		}
		// Reported before any write: not exact (shaper.WithWire), though the
		// downstream is on loopback.
		if n := wires.exact.Load(); n != 0 {
			t.Errorf("%d exact wire reports for a request that waits for its token; want 0", n)
		}
		if ok, bad, _ := down.counts(); ok+bad != 0 {
			t.Errorf("the downstream got %d requests without a token", ok+bad)
		}
	})
	t.Run("down", func(t *testing.T) {
		ts := newTokenServer(t, time.Hour)
		ts.down.Store(true)
		down := newCheckingDownstream(t, ts)
		s := newHTTP(t, sinks.HTTPConfig{URL: down.srv.URL, Auth: oauthConfig(ts)})
		for range 20 {
			err := send(t, s, testMessage())
			var se *shaper.SinkError
			if !errors.As(err, &se) || se.Status != 0 || se.Permanent {
				t.Fatalf("send with the token endpoint down: %v; want a retryable SinkError with Status 0", err)
			}
		}
		// 20 Sends in well under TokenRetryDelay: the endpoint is not hammered.
		if c := ts.calls.Load(); c > 3 {
			t.Errorf("token endpoint called %d times for 20 failing Sends; want at most 3", c)
		}
		ts.down.Store(false)
		time.Sleep(sinks.TokenRetryDelay + 50*time.Millisecond)
		if err := send(t, s, testMessage()); err != nil {
			t.Errorf("send after the token endpoint came back: %v", err)
		}
	})
	t.Run("bad secret", func(t *testing.T) {
		ts := newTokenServer(t, time.Hour)
		down := newCheckingDownstream(t, ts)
		cfg := oauthConfig(ts)
		cfg.ClientSecret = "wrong-" + testClientSecret
		s := newHTTP(t, sinks.HTTPConfig{URL: down.srv.URL, Auth: cfg})
		err := send(t, s, testMessage())
		if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "invalid_client") {
			t.Fatalf("send with a refused client: %v; want the token endpoint's 401 (invalid_client)", err)
		}
		if strings.Contains(err.Error(), testClientSecret) {
			t.Errorf("the error shows the client secret: %v", err)
		}
	})
}

func waitTokenCalls(t *testing.T, ts *tokenServer, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for ts.calls.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("token endpoint called %d times, want %d", ts.calls.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOAuth2ShortTokensUnderLane: tokens that live 2 s, a lane at 50/s for
// 10 s through the drain worker: every request carries a token the token
// server issued and that has not expired, the token endpoint is called
// about once per token lifetime (not per request), and the departures keep
// SPEC G1's windows.
func TestOAuth2ShortTokensUnderLane(t *testing.T) {
	const (
		limit      = 50
		seconds    = 10
		n          = limit * seconds
		tokenDelay = 60 * time.Millisecond // the token endpoint's latency
	)
	ts := newTokenServer(t, 2*time.Second)
	ts.delay.Store(int64(tokenDelay))
	down := newCheckingDownstream(t, ts)
	cfg := wireLaneConfig(t, limit, 8)
	src := newMemSource(n)
	s := &timedSink{HTTP: newHTTP(t, sinks.HTTPConfig{URL: down.srv.URL, Auth: oauthConfig(ts)}, sinks.WithMaxIdleConnsPerHost(8))}
	lane, err := drain.New("oauth", cfg, src, s)
	if err != nil {
		t.Fatal(err)
	}
	driveLane(lane, src, n, 3*seconds*time.Second)

	ok, bad, _ := down.counts()
	if got := src.acked.Load(); got != n || ok != n || bad != 0 {
		t.Errorf("%d of %d acked (%d nak'd); downstream accepted %d, refused %d", got, n, src.nacked.Load(), ok, bad)
	}
	calls := ts.calls.Load()
	// 10 s of tokens living 2 s, refreshed a tenth of their life early: 6.
	if calls < 5 || calls > 9 {
		t.Errorf("token endpoint called %d times in %d s with tokens of 2 s; want about 6", calls, seconds)
	}
	// The refresh runs ahead of expiry, in the background: only the first
	// Sends (before the first token) wait for the token endpoint.
	if slow := s.slower(tokenDelay * 3 / 4); slow > 4 {
		t.Errorf("%d Sends took longer than %v: they waited for the token endpoint (refresh not ahead of expiry)", slow, tokenDelay*3/4)
	}
	dep := src.departures() // in ack order
	slices.SortFunc(dep, time.Time.Compare)
	for _, w := range []time.Duration{100 * time.Millisecond, time.Second} {
		got, at := shapertest.MaxInWindow(dep, w)
		if bound := shapertest.BoundWhole(w, limit, 0); got > bound {
			t.Errorf("%d departures in the %v window at %v; G1 allows %d", got, w, at.Sub(dep[0]), bound)
		}
	}
	got1s, _ := shapertest.MaxInWindow(dep, time.Second)
	t.Logf("%d requests at %d/s with 2 s tokens from an endpoint answering in %v: %d token requests, all requests authorised; "+
		"%d Sends waited for a token; most departures in 1 s: %d", n, limit, tokenDelay, calls, s.slower(tokenDelay*3/4), got1s)
}

// timedSink counts the Sends of an HTTP sink that took longer than a bound.
type timedSink struct {
	*sinks.HTTP
	mu   sync.Mutex
	took []time.Duration
}

func (s *timedSink) Send(ctx context.Context, m *shaper.Message) error {
	start := time.Now()
	err := s.HTTP.Send(ctx, m)
	s.mu.Lock()
	s.took = append(s.took, time.Since(start))
	s.mu.Unlock()
	return err
}

func (s *timedSink) slower(d time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.took {
		if x > d {
			n++
		}
	}
	return n
}

// TestBearerFile: the token file's trimmed contents are sent as a Bearer
// token; a new file renamed into place (as Vault agent and Kubernetes
// write them) is used by the next requests without a restart.
func TestBearerFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	writeRename(t, path, "tok-A\n")
	var mu sync.Mutex
	var seen []string
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL, Auth: sinks.AuthConfig{Kind: sinks.AuthBearerFile, Path: path}})
	if err := send(t, s, testMessage()); err != nil {
		t.Fatal(err)
	}
	writeRename(t, path, "  tok-B \n")
	deadline := time.Now().Add(3 * time.Second)
	for {
		if err := send(t, s, testMessage()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		last := seen[len(seen)-1]
		mu.Unlock()
		if last == "Bearer tok-B" {
			break
		}
		if last != "Bearer tok-A" || time.Now().After(deadline) {
			t.Fatalf("after the file changed the sink sends %q; want Bearer tok-B within 3s", last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if seen[0] != "Bearer tok-A" {
		t.Errorf("first request carried %q, want Bearer tok-A", seen[0])
	}
}

// TestBearerFileRetryOn401: a 401 re-reads the file once and retries once
// with the new token, in the same Send; an unchanged file leaves the 401
// standing (one request, permanent). The file is reached through a link
// whose target changes, which the directory watch does not see: only the
// re-read after the 401 can find the new token.
func TestBearerFileRetryOn401(t *testing.T) {
	real := filepath.Join(t.TempDir(), "token")
	writeRename(t, real, "tok-A")
	link := filepath.Join(t.TempDir(), "token")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer tok-B" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL, Auth: sinks.AuthConfig{Kind: sinks.AuthBearerFile, Path: link}})

	err := send(t, s, testMessage())
	var se *shaper.SinkError
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || !se.Permanent || len(seen) != 1 {
		t.Fatalf("401 with an unchanged file: %v after %d requests; want a permanent 401 after 1", err, len(seen))
	}
	writeRename(t, real, "tok-B")
	ctx, wires := wireCounter(context.Background())
	if err := s.Send(ctx, testMessage()); err != nil {
		t.Fatalf("send after the token changed: %v; want the retry with the new token to succeed", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 || seen[1] != "Bearer tok-A" || seen[2] != "Bearer tok-B" {
		t.Errorf("requests carried %q; want tok-A, then tok-A and its retry with tok-B", seen)
	}
	if wires.n.Load() != 1 {
		t.Errorf("%d wire reports for one Send; want 1", wires.n.Load())
	}
}

// writeRename writes body to a temporary file beside path and renames it
// into place, as Vault agent and Kubernetes' atomic writer do.
func writeRename(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestCheckAuth: each rule of sink.auth is a problem under its key.
func TestCheckAuth(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeRename(t, tokenFile, "tok")
	empty := filepath.Join(t.TempDir(), "empty")
	writeRename(t, empty, " \n")
	good := sinks.AuthConfig{Kind: sinks.AuthOAuth2, TokenURL: "https://idp.example/token", ClientID: "id", ClientSecret: "x"}
	with := func(f func(*sinks.AuthConfig)) sinks.AuthConfig { a := good; f(&a); return a }
	for _, tc := range []struct {
		name    string
		auth    sinks.AuthConfig
		headers map[string]string
		want    []string // keys with problems
	}{
		{"none", sinks.AuthConfig{}, map[string]string{"authorization": "Basic x"}, nil},
		{"oauth2 ok", good, nil, nil},
		{"bearer ok", sinks.AuthConfig{Kind: sinks.AuthBearerFile, Path: tokenFile}, nil, nil},
		{"unknown kind", sinks.AuthConfig{Kind: "basic"}, nil, []string{"auth.kind"}},
		{"oauth2 empty", sinks.AuthConfig{Kind: sinks.AuthOAuth2}, nil, []string{"auth.client_id", "auth.client_secret", "auth.token_url"}},
		{"token url", with(func(a *sinks.AuthConfig) { a.TokenURL = "idp.example/token" }), nil, []string{"auth.token_url"}},
		{"scope", with(func(a *sinks.AuthConfig) { a.Scopes = []string{"ok", "two words"} }), nil, []string{"auth.scopes[1]"}},
		{"reserved param", with(func(a *sinks.AuthConfig) { a.Params = map[string]string{"grant_type": "password"} }), nil, []string{"auth.params.grant_type"}},
		{"authorization header", good, map[string]string{"Authorization": "Bearer x"}, []string{"headers.Authorization"}},
		{"path with oauth2", with(func(a *sinks.AuthConfig) { a.Path = tokenFile }), nil, []string{"auth.path"}},
		{"bearer missing file", sinks.AuthConfig{Kind: sinks.AuthBearerFile, Path: tokenFile + ".no"}, nil, []string{"auth.path"}},
		{"bearer empty file", sinks.AuthConfig{Kind: sinks.AuthBearerFile, Path: empty}, nil, []string{"auth.path"}},
		{"bearer no path", sinks.AuthConfig{Kind: sinks.AuthBearerFile}, nil, []string{"auth.path"}},
		{"secret with none", sinks.AuthConfig{ClientSecret: "x"}, nil, []string{"auth.client_secret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range sinks.CheckAuth(tc.auth, tc.headers) {
				got = append(got, p.Key)
				if strings.Contains(p.Message, "Bearer x") || (tc.auth.ClientSecret != "" && strings.Contains(p.Message, tc.auth.ClientSecret+" ")) {
					t.Errorf("%s: message quotes a secret: %s", p.Key, p.Message)
				}
			}
			slices.Sort(got)
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("problems at %q, want %q", got, tc.want)
			}
		})
	}
}
