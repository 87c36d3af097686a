package sinks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/shaper-dev/shaper/shaper"
)

// Names of the request headers the HTTP sink sets itself. Configured headers
// may not use them (nor the X-Nats- prefix); NewHTTP rejects such a config.
const (
	// IdempotencyKeyHeader carries [shaper.Message.Key], stable across
	// redeliveries (SPEC G8).
	IdempotencyKeyHeader = "Idempotency-Key"
	// SubjectHeader carries the NATS subject the job was published to.
	SubjectHeader = "X-Shaper-Subject"
	// DeliveryHeader carries the delivery count, 1 on the first attempt
	// ([shaper.Message.NumDelivered]).
	DeliveryHeader = "X-Shaper-Delivery"
	// NATSHeaderPrefix is prepended to the name of every forwarded NATS
	// header of the job.
	NATSHeaderPrefix = "X-Nats-"
)

// Defaults of the HTTP sink.
const (
	// DefaultMethod is the request method when HTTPConfig.Method is empty.
	DefaultMethod = http.MethodPost
	// DefaultMaxIdleConnsPerHost is the size of the sink's keep-alive pool
	// and the smallest value [WithMaxIdleConnsPerHost] accepts.
	DefaultMaxIdleConnsPerHost = 64
	// maxDrain bounds how much of a response body is read (and discarded) so
	// the connection can be reused; a longer body closes the connection.
	maxDrain = 64 << 10
	// maxSnippet bounds how much of an error response's body is quoted in
	// the returned error.
	maxSnippet = 256
)

// HTTPConfig configures an HTTP sink: the keys of SPEC §4
// downstreams.<lane>.sink with kind http, after ${ENV} expansion.
type HTTPConfig struct {
	// URL is the absolute http or https URL every message is sent to.
	// Required. It may carry credentials (user:password@ for basic auth, a
	// token in the query); it never appears in errors or logs.
	URL string
	// Method is the request method; "" means POST. Standard methods are
	// upper-cased ("post" is POST); others are sent as written.
	Method string
	// Headers are set on every request. Values may be secrets (they come
	// from ${ENV} references) and never appear in errors or logs. "Host"
	// sets the request's Host. No Content-Type is sent unless configured.
	// Reserved names are rejected: Idempotency-Key, X-Shaper-Subject,
	// X-Shaper-Delivery, any X-Nats-* name, and the framing headers
	// Content-Length, Transfer-Encoding, Trailer and Connection.
	Headers map[string]string
	// SuccessStatus lists the statuses that mean "delivered": exact codes
	// ("200", "204") or classes ("2xx", case-insensitive). Empty means
	// ["2xx"]. It is consulted first, so it overrides the retry rules.
	SuccessStatus []string
	// RetryableStatus lists statuses to retry besides 408, 429 and 5xx
	// (for example 409 or 425 for a downstream that uses them for
	// transient conflicts). Optional.
	RetryableStatus []int
	// Client, when non-nil, sends the requests and is used as is: its
	// transport, timeout and redirect policy apply, and Close leaves it
	// alone. When nil the sink uses its own client: a keep-alive transport
	// with [DefaultMaxIdleConnsPerHost] idle connections, proxies from the
	// environment, no overall timeout (the ctx of Send bounds each call) and
	// no redirects followed (a 3xx is classified like any other status).
	Client *http.Client
}

// Option configures an HTTP sink. The set is closed: options are made by
// the With… functions of this package.
type Option interface{ apply(*httpOptions) }

type httpOptions struct {
	logger  *slog.Logger
	now     func() time.Time
	maxIdle int
}

type optionFunc func(*httpOptions)

func (f optionFunc) apply(o *httpOptions) { f(o) }

// WithLogger sets the logger for debug records (a skipped header, a
// malformed Retry-After). They carry header names only, never values or
// payloads. The default discards.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *httpOptions) {
		if l != nil {
			o.logger = l
		}
	})
}

// WithClock sets the clock that turns a Retry-After HTTP-date into a delay.
// The default is time.Now.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(o *httpOptions) {
		if now != nil {
			o.now = now
		}
	})
}

// WithMaxIdleConnsPerHost sizes the keep-alive pool of the sink's own
// transport; pass at least the lane's max_in_flight so a paced lane never
// opens new connections (each new TCP or TLS handshake adds latency jitter
// that breaks the spacing a rigid downstream judges, SPEC G1). Values below
// [DefaultMaxIdleConnsPerHost] are raised to it. It has no effect with
// HTTPConfig.Client.
func WithMaxIdleConnsPerHost(n int) Option {
	return optionFunc(func(o *httpOptions) { o.maxIdle = max(n, DefaultMaxIdleConnsPerHost) })
}

// HTTP delivers each message as one HTTP request. It is safe for concurrent
// use; see the package documentation for the contract of Send and Close.
//
// The request carries:
//   - the body: Message.Data, unchanged;
//   - the configured headers;
//   - Idempotency-Key: Message.Key(), the Nats-Msg-Id header when present,
//     else "<stream>:<stream sequence>" (SPEC G8);
//   - X-Shaper-Subject: Message.Subject, and X-Shaper-Delivery:
//     Message.NumDelivered in decimal;
//   - every NATS header of the job as X-Nats-<Name> with all its values
//     (name canonicalised the HTTP way: "trace-id" becomes
//     "X-Nats-Trace-Id"). Headers whose name starts with "Nats-" belong to
//     NATS itself (Nats-Expected-Stream, Nats-Rollup, …) and are not
//     forwarded, except Nats-Msg-Id, which is sent as X-Nats-Msg-Id (not
//     X-Nats-Nats-Msg-Id; a job header named Msg-Id lands there too, both
//     values kept). A header that HTTP cannot carry (a name that is not an
//     RFC 9110 token, a value with control characters) is skipped and
//     logged at debug level with its name only.
//
// The response is classified in this order:
//  1. a status in HTTPConfig.SuccessStatus: nil;
//  2. 408, 429, any 5xx, or a status in HTTPConfig.RetryableStatus: a
//     retryable *shaper.SinkError; on 429 and 503 Saturated is set, and a
//     valid Retry-After header ([ParseRetryAfter]) fills RetryAfter;
//  3. any other status (1xx, 3xx, other 4xx, …): a permanent SinkError
//     (SPEC §3: dead letter at once, reason rejected_by_sink).
//
// A network error or the end of ctx gives a retryable SinkError with Status
// 0 that wraps the cause (errors.Is(err, context.DeadlineExceeded) holds
// after a task timeout). Errors quote at most 256 bytes of the response
// body, escaped on one line; never the request, its URL or its headers.
type HTTP struct {
	client    *http.Client
	transport *http.Transport // owned; nil when HTTPConfig.Client was given
	url       string
	method    string
	host      string
	headers   http.Header
	success   statusSet
	retryable statusSet
	logger    *slog.Logger
	now       func() time.Time
	gate      gate
}

// NewHTTP returns an HTTP sink for cfg. It checks cfg and returns every
// problem at once (errors.Join), each prefixed with its key relative to the
// sink (url, method, headers.<name>, success_status[i], retryable_status[i])
// so the caller can add "downstreams.<lane>.sink.". Messages never repeat a
// header value or the URL, which may be secret.
func NewHTTP(cfg HTTPConfig, opts ...Option) (*HTTP, error) {
	o := httpOptions{
		logger:  slog.New(slog.DiscardHandler),
		now:     time.Now,
		maxIdle: DefaultMaxIdleConnsPerHost,
	}
	for _, opt := range opts {
		opt.apply(&o)
	}
	s := &HTTP{
		url:     cfg.URL,
		method:  cfg.Method,
		headers: make(http.Header, len(cfg.Headers)),
		logger:  o.logger,
		now:     o.now,
	}
	var errs []error
	if u, err := url.Parse(cfg.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, errors.New("url: must be an absolute http or https URL"))
	}
	if s.method == "" {
		s.method = DefaultMethod
	}
	if !isToken(s.method) {
		errs = append(errs, fmt.Errorf("method %q: not a valid HTTP method", s.method))
	}
	for _, std := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		if strings.EqualFold(s.method, std) {
			s.method = std
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Headers)) {
		value := cfg.Headers[name]
		if err := checkConfiguredHeader(name, value); err != nil {
			errs = append(errs, fmt.Errorf("headers.%s: %w", name, err))
			continue
		}
		if http.CanonicalHeaderKey(name) == "Host" {
			s.host = value
			continue
		}
		s.headers.Set(name, value)
	}
	if s.headers.Get("User-Agent") == "" {
		s.headers.Set("User-Agent", "shaper")
	}
	success := cfg.SuccessStatus
	if len(success) == 0 {
		success = []string{"2xx"}
	}
	for i, v := range success {
		if err := s.success.addPattern(v); err != nil {
			errs = append(errs, fmt.Errorf("success_status[%d] %q: %w", i, v, err))
		}
	}
	for i, code := range cfg.RetryableStatus {
		if code < 100 || code > 599 {
			errs = append(errs, fmt.Errorf("retryable_status[%d] %d: must be between 100 and 599", i, code))
			continue
		}
		s.retryable.add(code)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("sinks: http: %w", errors.Join(errs...))
	}

	if cfg.Client != nil {
		s.client = cfg.Client
		return s, nil
	}
	s.transport = &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: wireDialer(&net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
		}),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          o.maxIdle,
		MaxIdleConnsPerHost:   o.maxIdle,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// No Accept-Encoding: gzip that Go's transport would add on its
		// own: the downstream receives only the headers the README lists
		// (issue 12); only a short snippet of an error body is read.
		DisableCompression: true,
	}
	s.client = &http.Client{
		Transport: s.transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return s, nil
}

// wireConn reports, once per request, when a Write of the connection
// returned: the request left for the downstream (shaper.WithWire). HTTP/1.1
// sends one request at a time on a connection, and the transport flushes a
// request with small body in one Write.
type wireConn struct {
	net.Conn
	pending atomic.Pointer[func(time.Time)]
}

func (c *wireConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if fn := c.pending.Swap(nil); fn != nil && err == nil {
		(*fn)(time.Now())
	}
	return n, err
}

func wireDialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &wireConn{Conn: c}, nil
	}
}

// ReportsWire reports true: Send calls the function of shaper.WithWire when
// the request has been written to the connection (drain.WireReporter).
func (s *HTTP) ReportsWire() bool { return true }

// Send delivers m as one request and classifies the response (see [HTTP]).
// It returns nil on success, otherwise a *shaper.SinkError.
func (s *HTTP) Send(ctx context.Context, m *shaper.Message) error {
	if !s.gate.enter() {
		return retryable("http", ErrClosed)
	}
	defer s.gate.leave()
	what := "http " + s.method
	if err := ctx.Err(); err != nil {
		return retryable(what, err)
	}
	key := m.Key()
	if !validHeaderValue(key) {
		// The key cannot travel as a header, and no redelivery changes it.
		return &shaper.SinkError{Permanent: true, Err: fmt.Errorf("%s: idempotency key is not a valid HTTP header value", what)}
	}
	rctx := ctx
	if wire := shaper.WireFrom(ctx); wire != nil {
		// Report when the request is on the wire (shaper.WithWire): when
		// the connection's Write of it returned. WroteRequest alone is too
		// early — it fires when the request is in the connection's buffer,
		// before the transport's writer goroutine flushes it, and that
		// goroutine can be descheduled in between (measured: 1 ms). It is the
		// fallback for a caller-supplied Client, whose connections are not
		// ours.
		var viaConn atomic.Bool
		rctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				c := info.Conn
				if tc, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS
					c = tc.NetConn()
				}
				if wc, ok := c.(*wireConn); ok {
					viaConn.Store(true)
					wc.pending.Store(&wire)
				}
			},
			WroteRequest: func(info httptrace.WroteRequestInfo) {
				if info.Err == nil && !viaConn.Load() {
					wire(time.Now())
				}
			},
		})
	}
	req, err := http.NewRequestWithContext(rctx, s.method, s.url, bytes.NewReader(m.Data))
	if err != nil {
		return retryable(what, stripURL(err))
	}
	if s.host != "" {
		req.Host = s.host
	}
	h := req.Header
	for name, values := range s.headers {
		h[name] = values // shared, read-only: transports do not modify requests
	}
	s.forwardNATSHeaders(h, m.Header)
	h.Set(IdempotencyKeyHeader, key)
	h.Set(SubjectHeader, m.Subject)
	h.Set(DeliveryHeader, strconv.FormatUint(m.NumDelivered, 10))

	resp, err := s.client.Do(req)
	if err != nil {
		cause := stripURL(err)
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(cause, ctxErr) {
			cause = fmt.Errorf("%w (%v)", ctxErr, cause)
		}
		return retryable(what, cause)
	}
	if report := shaper.RateLimitReportFrom(ctx); report != nil { // rate.adaptive.headers
		if info, ok := ParseRateLimit(resp.Header, s.now()); ok {
			report(info)
		}
	}
	return s.classify(what, resp)
}

// classify turns a response into Send's result. It drains and closes the
// body so the connection goes back to the keep-alive pool.
func (s *HTTP) classify(what string, resp *http.Response) error {
	code := resp.StatusCode
	if s.success.has(code) {
		_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
		_ = resp.Body.Close()
		return nil
	}
	snippet := make([]byte, maxSnippet)
	n, _ := io.ReadFull(resp.Body, snippet)
	snippet = snippet[:n]
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain-maxSnippet)
	_ = resp.Body.Close()

	e := &shaper.SinkError{Status: code}
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests,
		code >= 500 && code <= 599, s.retryable.has(code):
		e.Saturated = code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable
	default:
		e.Permanent = true
	}
	if v := resp.Header.Get("Retry-After"); v != "" {
		if d, ok := ParseRetryAfter(v, s.now()); ok {
			e.RetryAfter = d
		} else {
			s.logger.Debug("sink ignored a malformed Retry-After header", "status", code)
		}
	}
	msg := what + ": " + http.StatusText(code)
	if len(snippet) > 0 {
		msg += fmt.Sprintf(": response body %q", snippet)
	}
	e.Err = errors.New(msg)
	return e
}

// forwardNATSHeaders copies the job's NATS headers into h as X-Nats-<Name>,
// skipping NATS's own headers (except Nats-Msg-Id) and those HTTP cannot
// carry.
func (s *HTTP) forwardNATSHeaders(h http.Header, from map[string][]string) {
	for name, values := range from {
		key := http.CanonicalHeaderKey(NATSHeaderPrefix + name)
		switch {
		case strings.EqualFold(name, shaper.MsgIDHeader):
			key = NATSHeaderPrefix + "Msg-Id"
		case hasPrefixFold(name, "Nats-"):
			continue
		case !isToken(name):
			s.logger.Debug("sink skipped a NATS header with a name HTTP cannot carry", "header", name)
			continue
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				s.logger.Debug("sink skipped a NATS header value HTTP cannot carry", "header", name)
				continue
			}
			h[key] = append(h[key], v)
		}
		// The producer's Content-Type describes the body, which is sent as
		// it is: pass it on as the request's own, unless sink.headers set one.
		if strings.EqualFold(name, "Content-Type") && h.Get("Content-Type") == "" && len(values) > 0 && validHeaderValue(values[0]) {
			h.Set("Content-Type", values[0])
		}
	}
}

// Close waits for Sends in progress, then closes the idle connections of
// the sink's own transport (a caller's HTTPConfig.Client is left alone).
// It always returns nil; later calls return at once.
func (s *HTTP) Close() error {
	if s.gate.close() && s.transport != nil {
		s.transport.CloseIdleConnections()
	}
	return nil
}

// statusSet is a set of HTTP status codes 100–599.
type statusSet [600]bool

func (s *statusSet) add(code int) { s[code] = true }

func (s *statusSet) has(code int) bool { return code >= 0 && code < len(s) && s[code] }

// addPattern adds an exact code ("204") or a class ("2xx").
func (s *statusSet) addPattern(p string) error {
	p = strings.TrimSpace(p)
	if len(p) == 3 && p[0] >= '1' && p[0] <= '5' && strings.EqualFold(p[1:], "xx") {
		base := int(p[0]-'0') * 100
		for c := base; c < base+100; c++ {
			s.add(c)
		}
		return nil
	}
	if len(p) == 3 && allDigits(p) {
		if c, _ := strconv.Atoi(p); c >= 100 && c <= 599 {
			s.add(c)
			return nil
		}
	}
	return errors.New("want a status code 100-599 or a class 1xx-5xx")
}

// checkConfiguredHeader reports why a configured header cannot be used.
// It never quotes the value.
func checkConfiguredHeader(name, value string) error {
	if !isToken(name) {
		return errors.New("not a valid header name")
	}
	if !validHeaderValue(value) {
		return errors.New("value contains control characters")
	}
	switch c := http.CanonicalHeaderKey(name); {
	case c == IdempotencyKeyHeader, c == SubjectHeader, c == DeliveryHeader,
		hasPrefixFold(c, NATSHeaderPrefix):
		return errors.New("reserved: the sink sets this header itself")
	case c == "Content-Length", c == "Transfer-Encoding", c == "Trailer", c == "Connection":
		return errors.New("reserved: framing is managed by the HTTP client")
	}
	return nil
}

// stripURL removes the *url.Error layer, whose text repeats the request URL
// (which may carry credentials), and keeps its cause.
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// isToken reports whether s is an RFC 9110 token (header names, methods).
func isToken(s string) bool { return httpguts.ValidHeaderFieldName(s) }

// validHeaderValue reports whether v can be sent as a header value: no
// control characters other than horizontal tab (RFC 9110 §5.5).
func validHeaderValue(v string) bool { return httpguts.ValidHeaderFieldValue(v) }

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
