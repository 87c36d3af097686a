package sinks_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
	"github.com/shaper-dev/shaper/sinks/sinktest"
)

// newServer starts an httptest.Server closed by t.Cleanup.
func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// newHTTP builds an HTTP sink closed by t.Cleanup (registered after the
// server's, so it runs first).
func newHTTP(t *testing.T, cfg sinks.HTTPConfig, opts ...sinks.Option) *sinks.HTTP {
	t.Helper()
	s, err := sinks.NewHTTP(cfg, opts...)
	if err != nil {
		t.Fatalf("NewHTTP: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func testMessage() *shaper.Message {
	return &shaper.Message{
		Subject:      "callbacks.payments.eu",
		Header:       map[string][]string{},
		Data:         []byte(`{"amount":100}`),
		Stream:       "CALLBACKS",
		StreamSeq:    42,
		NumDelivered: 1,
	}
}

func send(t *testing.T, s interface {
	Send(context.Context, *shaper.Message) error
}, m *shaper.Message) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Send(ctx, m)
}

func TestHTTPConformance(t *testing.T) {
	sinktest.Run(t, httpHarness(func(s *sinks.HTTP) sinktest.Sink { return s }))
}

// httpHarness is the conformance suite's harness for the HTTP sink, each
// sink passed through wrap (TestHTTPDirectConformance: as a gated lane
// sends).
func httpHarness(wrap func(*sinks.HTTP) sinktest.Sink) sinktest.Harness {
	return sinktest.Harness{
		NewSink: func(t *testing.T) (sinktest.Sink, func() int) {
			var n atomic.Int64
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				w.WriteHeader(http.StatusNoContent)
			}))
			s, err := sinks.NewHTTP(sinks.HTTPConfig{URL: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			return wrap(s), func() int { return int(n.Load()) }
		},
		NewStalledSink: func(t *testing.T) (sinktest.Sink, func()) {
			stop := make(chan struct{})
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-stop:
				case <-r.Context().Done():
				}
			}))
			s, err := sinks.NewHTTP(sinks.HTTPConfig{URL: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			return wrap(s), sync.OnceFunc(func() { close(stop) })
		},
	}
}

func TestHTTPStatus(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	type want struct {
		ok         bool // nil error
		permanent  bool
		saturated  bool
		retryAfter time.Duration
	}
	tests := []struct {
		name       string
		status     int
		header     map[string]string
		body       string
		success    []string
		retryable  []int
		want       want
		errContain string
	}{
		{name: "200", status: 200, want: want{ok: true}},
		{name: "204", status: 204, want: want{ok: true}},
		{name: "299 in 2xx", status: 299, want: want{ok: true}},
		{name: "201 in explicit list", status: 201, success: []string{"200", "201"}, want: want{ok: true}},
		{name: "204 outside [200]", status: 204, success: []string{"200"}, want: want{permanent: true}},
		{name: "302 in 3xx", status: 302, success: []string{"2XX", "3xx"}, header: map[string]string{"Location": "/elsewhere"}, want: want{ok: true}},
		{name: "301 not followed", status: 301, header: map[string]string{"Location": "/elsewhere"}, want: want{permanent: true}},
		{name: "400 with body", status: 400, body: "bad signature\r\nsecond line", want: want{permanent: true}, errContain: `"bad signature\r\nsecond line"`},
		{name: "404", status: 404, want: want{permanent: true}},
		{name: "408", status: 408, want: want{}},
		{name: "409", status: 409, want: want{permanent: true}},
		{name: "409 listed retryable", status: 409, retryable: []int{409}, want: want{}},
		{name: "429 Retry-After seconds", status: 429, header: map[string]string{"Retry-After": "7"}, want: want{saturated: true, retryAfter: 7 * time.Second}},
		{name: "429 Retry-After date", status: 429, header: map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, want: want{saturated: true, retryAfter: 90 * time.Second}},
		{name: "429 Retry-After date past", status: 429, header: map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, want: want{saturated: true}},
		{name: "429 Retry-After garbage", status: 429, header: map[string]string{"Retry-After": "soon"}, want: want{saturated: true}},
		{name: "429 no Retry-After", status: 429, want: want{saturated: true}},
		{name: "500", status: 500, want: want{}},
		{name: "502", status: 502, want: want{}},
		{name: "503 Retry-After", status: 503, header: map[string]string{"Retry-After": "120"}, want: want{saturated: true, retryAfter: 2 * time.Minute}},
		{name: "504", status: 504, want: want{}},
		{name: "500 with huge body", status: 500, body: strings.Repeat("x", 1<<20), want: want{}, errContain: `"` + strings.Repeat("x", 256) + `"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var elsewhere atomic.Int64
			mux := http.NewServeMux()
			mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) })
			mux.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			srv := newServer(t, mux)
			s := newHTTP(t, sinks.HTTPConfig{
				URL:             srv.URL + "/hook",
				SuccessStatus:   tt.success,
				RetryableStatus: tt.retryable,
			}, sinks.WithClock(func() time.Time { return now }))

			err := send(t, s, testMessage())
			if elsewhere.Load() != 0 {
				t.Errorf("the sink followed a redirect")
			}
			if tt.want.ok {
				if err != nil {
					t.Fatalf("Send: %v, want nil", err)
				}
				return
			}
			var se *shaper.SinkError
			if !errors.As(err, &se) {
				t.Fatalf("Send: %v (%T), want a *shaper.SinkError", err, err)
			}
			if se.Status != tt.status {
				t.Errorf("Status = %d, want %d", se.Status, tt.status)
			}
			if se.Permanent != tt.want.permanent || errors.Is(err, shaper.ErrPermanent) != tt.want.permanent {
				t.Errorf("Permanent = %v, errors.Is(ErrPermanent) = %v; want %v", se.Permanent, errors.Is(err, shaper.ErrPermanent), tt.want.permanent)
			}
			if se.Saturated != tt.want.saturated {
				t.Errorf("Saturated = %v, want %v", se.Saturated, tt.want.saturated)
			}
			if se.RetryAfter != tt.want.retryAfter {
				t.Errorf("RetryAfter = %v, want %v", se.RetryAfter, tt.want.retryAfter)
			}
			if !strings.Contains(err.Error(), tt.errContain) {
				t.Errorf("error %q does not contain %q", err, tt.errContain)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error text is %d bytes long, want the body quoted to at most 256", len(err.Error()))
			}
		})
	}
}

func TestHTTPTimeout(t *testing.T) {
	stop := make(chan struct{})
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(stop) }) // runs before srv.Close
	s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL})

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Send(ctx, testMessage())
	elapsed := time.Since(start)
	var se *shaper.SinkError
	if !errors.As(err, &se) || se.Status != 0 || se.Permanent || se.Saturated {
		t.Fatalf("Send on a hanging handler: %#v, want a retryable *shaper.SinkError with status 0", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%v, context.DeadlineExceeded) = false", err)
	}
	if elapsed > time.Second {
		t.Errorf("Send took %v with a 100ms timeout", elapsed)
	}
}

func TestHTTPNetworkErrorHidesURL(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	s := newHTTP(t, sinks.HTTPConfig{URL: "http://user:hunter2@" + addr + "/hook?token=hunter2"})

	err = send(t, s, testMessage())
	var se *shaper.SinkError
	if !errors.As(err, &se) || se.Status != 0 || se.Permanent {
		t.Fatalf("Send to a closed port: %v, want a retryable *shaper.SinkError with status 0", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %q reveals the URL's credentials", err)
	}
}

// TestHTTPEchoedSecretRedacted: a downstream that echoes the request's
// credentials in its error body (an API key header, the URL's basic
// password, a token in the query) does not bring them into Send's error,
// which reaches the dead letters, the admin API and `shaper lanes` (a
// new-user pass found the key in all three).
func TestHTTPEchoedSecretRedacted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pw, _ := r.BasicAuth()
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, "bad key %s for %s:%s token %s", r.Header.Get("X-Api-Key"), user, pw, r.URL.Query().Get("token"))
	}))
	defer srv.Close()
	u := strings.Replace(srv.URL, "http://", "http://svc:Pa55word9@", 1) + "/hook?token=Tok3nInQuery"
	s := newHTTP(t, sinks.HTTPConfig{URL: u, Headers: map[string]string{"X-Api-Key": "TopSecretToken789"}})
	err := send(t, s, testMessage())
	if err == nil {
		t.Fatal("a 401 was a success")
	}
	for _, secret := range []string{"TopSecretToken789", "Pa55word9", "Tok3nInQuery"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error %q shows %q", err, secret)
		}
	}
	if !strings.Contains(err.Error(), "bad key [redacted]") {
		t.Errorf("error %q: want the body's excerpt with the key redacted", err)
	}
}

func TestHTTPRequest(t *testing.T) {
	type seen struct {
		method, host, path string
		header             http.Header
		body               []byte
	}
	got := make(chan seen, 1)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.Host, r.URL.Path, r.Header.Clone(), body}
	}))
	s := newHTTP(t, sinks.HTTPConfig{
		URL:    srv.URL + "/hook",
		Method: "put",
		Headers: map[string]string{
			"Authorization": "Bearer s3cret",
			"content-type":  "application/json",
			"Host":          "callbacks.example.com",
		},
	})

	binary := []byte{0, 1, 2, 0xff, '\n', 'x'}
	tests := []struct {
		name       string
		header     map[string][]string
		wantKey    string
		wantHeader map[string][]string // nil value = must be absent
	}{
		{
			name:    "with Nats-Msg-Id",
			header:  map[string][]string{"Nats-Msg-Id": {"order-7"}},
			wantKey: "order-7",
			wantHeader: map[string][]string{
				"X-Nats-Msg-Id": {"order-7"},
			},
		},
		{
			// A replayed dead letter travels under an id of its own; the
			// receiver sees the publisher's (shaper.OrigMsgIDHeader).
			name: "replayed dead letter",
			header: map[string][]string{"Nats-Msg-Id": {"replay/SHAPER_DEAD/12"}, "Shaper-Msg-Id": {"order-7"},
				"Shaper-Key": {"order-7"}, "Shaper-Replay-Of": {"12"}},
			wantKey: "order-7",
			wantHeader: map[string][]string{
				"X-Nats-Msg-Id":           {"order-7"},
				"X-Nats-Shaper-Msg-Id":    nil,
				"X-Nats-Shaper-Replay-Of": {"12"},
				"X-Nats-Shaper-Key":       {"order-7"},
			},
		},
		{
			// Shaper-Msg-Id means something on a replay only.
			name:    "Shaper-Msg-Id without a replay",
			header:  map[string][]string{"Nats-Msg-Id": {"order-8"}, "Shaper-Msg-Id": {"forged"}},
			wantKey: "order-8",
			wantHeader: map[string][]string{
				"X-Nats-Msg-Id":        {"order-8"},
				"X-Nats-Shaper-Msg-Id": nil,
			},
		},
		{
			name: "without Nats-Msg-Id",
			header: map[string][]string{
				"trace-id":             {"abc"},
				"Tag":                  {"a", "b"},
				"Nats-Expected-Stream": {"CALLBACKS"},
				"nats-rollup":          {"sub"},
				"Broken":               {"x\r\ny"},
				"Bad Name":             {"v"},
			},
			wantKey: "CALLBACKS:42",
			wantHeader: map[string][]string{
				"X-Nats-Trace-Id":             {"abc"},
				"X-Nats-Tag":                  {"a", "b"},
				"X-Nats-Nats-Expected-Stream": nil,
				"X-Nats-Expected-Stream":      nil,
				"X-Nats-Nats-Rollup":          nil,
				"X-Nats-Broken":               nil,
				"X-Nats-Msg-Id":               nil,
			},
		},
	}
	for _, tt := range tests {
		for _, packed := range []bool{false, true} { // packed: as the lane leaves them (drain.PackedHeaderReader)
			t.Run(fmt.Sprintf("%s/packed=%v", tt.name, packed), func(t *testing.T) {
				m := testMessage()
				if packed {
					m.PackHeader(tt.header)
				} else {
					m.Header = tt.header
				}
				m.Data = binary
				m.NumDelivered = 3
				if err := send(t, s, m); err != nil {
					t.Fatalf("Send: %v", err)
				}
				r := <-got
				if r.method != http.MethodPut || r.path != "/hook" || r.host != "callbacks.example.com" {
					t.Errorf("request %s %s to host %q, want PUT /hook to callbacks.example.com", r.method, r.path, r.host)
				}
				if string(r.body) != string(binary) {
					t.Errorf("body = %q, want %q", r.body, binary)
				}
				want := map[string][]string{
					"Idempotency-Key":   {tt.wantKey},
					"X-Shaper-Subject":  {"callbacks.payments.eu"},
					"X-Shaper-Delivery": {"3"},
					"Authorization":     {"Bearer s3cret"},
					"Content-Type":      {"application/json"},
					"User-Agent":        {"shaper"},
				}
				for k, v := range tt.wantHeader {
					want[k] = v
				}
				for k, v := range want {
					if !slices.Equal(r.header[k], v) {
						t.Errorf("header %s = %q, want %q", k, r.header[k], v)
					}
				}
				// Issue 12: nothing the README does not list, such as the
				// Accept-Encoding: gzip Go's transport adds by default.
				if v, ok := r.header["Accept-Encoding"]; ok {
					t.Errorf("header Accept-Encoding = %q, want none (not documented)", v)
				}
				for k := range r.header {
					if strings.HasPrefix(k, "X-Nats-") {
						if _, ok := want[k]; !ok {
							t.Errorf("unexpected header %s: %q", k, r.header[k])
						}
					}
				}
			})
		}
	}
}

func TestNewHTTPConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  sinks.HTTPConfig
		want []string // substrings of the error
	}{
		{"empty URL", sinks.HTTPConfig{}, []string{"url:"}},
		{"relative URL", sinks.HTTPConfig{URL: "/hook"}, []string{"url:"}},
		{"ftp URL", sinks.HTTPConfig{URL: "ftp://example.com/x"}, []string{"url:"}},
		{"bad method", sinks.HTTPConfig{URL: "http://x", Method: "PO ST"}, []string{`method: "PO ST" is not a valid HTTP method`}},
		{"reserved header", sinks.HTTPConfig{URL: "http://x", Headers: map[string]string{"idempotency-key": "k"}}, []string{"headers.idempotency-key: \"Idempotency-Key\" reserved"}},
		{"X-Nats header", sinks.HTTPConfig{URL: "http://x", Headers: map[string]string{"X-Nats-Foo": "k"}}, []string{"headers.X-Nats-Foo: \"X-Nats-Foo\" reserved"}},
		{"framing header", sinks.HTTPConfig{URL: "http://x", Headers: map[string]string{"Content-Length": "3"}}, []string{"headers.Content-Length: \"Content-Length\" reserved"}},
		{"bad header name", sinks.HTTPConfig{URL: "http://x", Headers: map[string]string{"A B": "v"}}, []string{"headers.A B:"}},
		{"bad success", sinks.HTTPConfig{URL: "http://x", SuccessStatus: []string{"2xx", "20x", "600", "abc"}}, []string{`success_status[1]: "20x"`, `success_status[2]: "600"`, `success_status[3]: "abc"`}},
		{"bad retryable", sinks.HTTPConfig{URL: "http://x", RetryableStatus: []int{409, 42}}, []string{"retryable_status[1]: must be a status code 100-599, got 42"}},
		{"retryable also a success", sinks.HTTPConfig{URL: "http://x", SuccessStatus: []string{"2xx", "409"}, RetryableStatus: []int{409, 503}}, []string{"retryable_status[0]: 409 is also a success_status"}},
		{"all at once", sinks.HTTPConfig{URL: "nope", Method: "A B", SuccessStatus: []string{"x"}}, []string{"url:", "method", "success_status[0]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := sinks.NewHTTP(tt.cfg)
			if err == nil {
				_ = s.Close()
				t.Fatal("NewHTTP accepted the config")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}

	t.Run("secret value not repeated", func(t *testing.T) {
		_, err := sinks.NewHTTP(sinks.HTTPConfig{URL: "http://u:hunter2@x", Headers: map[string]string{"Authorization": "hunter2\n"}})
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("NewHTTP error %v: want an error that does not repeat the value", err)
		}
	})
}

// connCounter counts the TCP connections a server accepts.
type connCounter struct{ n atomic.Int64 }

func (c *connCounter) hook(_ net.Conn, s http.ConnState) {
	if s == http.StateNew {
		c.n.Add(1)
	}
}

func TestHTTPReusesConnections(t *testing.T) {
	t.Run("sequential, any status", func(t *testing.T) {
		var conns connCounter
		statuses := []int{200, 500, 429, 404, 204}
		var i atomic.Int64
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(statuses[int(i.Add(1))%len(statuses)])
			_, _ = io.WriteString(w, strings.Repeat("response body ", 100))
		}))
		srv.Config.ConnState = conns.hook
		srv.Start()
		t.Cleanup(srv.Close)
		s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL})
		for range 100 {
			_ = send(t, s, testMessage())
		}
		if n := conns.n.Load(); n != 1 {
			t.Errorf("100 sequential Sends opened %d connections, want 1", n)
		}
	})

	// Two rounds of 80 requests held in the handler at once: the second
	// round finds the first round's connections idle in the pool, as many
	// as the pool keeps.
	rounds := func(t *testing.T, opts ...sinks.Option) (second int64) {
		const n = 80
		var conns connCounter
		var arrived atomic.Int64
		var mu sync.Mutex
		full := make(chan struct{})
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			ch := full
			if arrived.Add(1)%n == 0 {
				close(full)
				full = make(chan struct{})
			}
			mu.Unlock()
			select {
			case <-ch:
			case <-time.After(5 * time.Second):
				t.Error("a round did not gather all its requests")
			}
		}))
		srv.Config.ConnState = conns.hook
		srv.Start()
		t.Cleanup(srv.Close)
		s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL}, opts...)
		round := func() {
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					if err := send(t, s, testMessage()); err != nil {
						t.Errorf("Send: %v", err)
					}
				})
			}
			wg.Wait()
		}
		round()
		first := conns.n.Load()
		round()
		return conns.n.Load() - first
	}
	t.Run("pool of 80", func(t *testing.T) {
		if got := rounds(t, sinks.WithMaxIdleConnsPerHost(80)); got != 0 {
			t.Errorf("second round opened %d new connections, want 0", got)
		}
	})
	t.Run("default pool of 64", func(t *testing.T) {
		if got := rounds(t); got != 80-sinks.DefaultMaxIdleConnsPerHost {
			t.Errorf("second round opened %d new connections, want %d", got, 80-sinks.DefaultMaxIdleConnsPerHost)
		}
	})
}

func TestHTTPCustomClient(t *testing.T) {
	var n atomic.Int64
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
	client := srv.Client()
	s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL, Client: client})
	if err := send(t, s, testMessage()); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Close left the caller's client usable.
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("caller's client after Close: %v", err)
	}
	_ = resp.Body.Close()
	if n.Load() != 2 {
		t.Errorf("server saw %d requests, want 2", n.Load())
	}
}

func TestHTTPCloseWaitsForSends(t *testing.T) {
	started := make(chan struct{})
	stop := make(chan struct{})
	var once sync.Once
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		<-stop
	}))
	s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL})
	errc := make(chan error, 1)
	go func() { errc <- send(t, s, testMessage()) }()
	<-started

	closed := make(chan struct{})
	go func() {
		_ = s.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a Send was in progress")
	case <-time.After(100 * time.Millisecond):
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Errorf("Send in progress during Close: %v", err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the Send")
	}
	err := send(t, s, testMessage())
	if !errors.Is(err, sinks.ErrClosed) || errors.Is(err, shaper.ErrPermanent) {
		t.Errorf("Send after Close: %v, want a retryable error wrapping ErrClosed", err)
	}
}

// TestHTTPContentTypeFromMessage: the producer's Content-Type becomes the
// request's, unless sink.headers sets one.
func TestHTTPContentTypeFromMessage(t *testing.T) {
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Content-Type")
		w.WriteHeader(204)
	}))
	defer srv.Close()
	m := &shaper.Message{Stream: "S", StreamSeq: 1, Data: []byte(`{}`), Header: map[string][]string{"Content-Type": {"application/json"}}}
	packed := &shaper.Message{Stream: "S", StreamSeq: 1, Data: []byte(`{}`)}
	packed.PackHeader(map[string][]string{"content-type": {"application/json", "text/csv"}})
	for _, tc := range []struct {
		headers map[string]string
		m       *shaper.Message
		want    string
	}{
		{nil, m, "application/json"}, {map[string]string{"Content-Type": "text/plain"}, m, "text/plain"},
		{nil, packed, "application/json"}, // packed, the producer's case, the first value
	} {
		m := tc.m
		s, err := sinks.NewHTTP(sinks.HTTPConfig{URL: srv.URL, Headers: tc.headers})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		if ct := <-got; ct != tc.want {
			t.Errorf("Content-Type %q, want %q", ct, tc.want)
		}
		s.Close()
	}
}
