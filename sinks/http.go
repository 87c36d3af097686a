package sinks

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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
	// token in the query); it never appears in errors or logs. Its path and
	// query may use {header:NAME} and {subject:N}, filled from each message
	// ([URLTemplate]).
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
	// Signing signs every request (sink.signing, signing.go); the zero
	// value signs nothing.
	Signing SigningConfig
	// Client, when non-nil, sends the requests and is used as is: its
	// transport, timeout and redirect policy apply, and Close leaves it
	// alone. When nil the sink uses its own keep-alive transport, with
	// [DefaultMaxIdleConnsPerHost] idle connections and proxies from the
	// environment, directly (no http.Client: issue 15): no overall timeout
	// (the ctx of Send bounds each call), no redirects followed (a 3xx is
	// classified like any other status), the URL's user info sent as basic
	// auth unless an Authorization header is set, as http.Client would.
	Client *http.Client
	// Auth is sink.auth: the Authorization header the sink sets itself
	// (auth.go). The zero value sends none.
	Auth AuthConfig
	// TLS is sink.tls: CA bundle and client certificate (tlsfiles.go); not
	// with Client.
	TLS TLSFiles
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
// The request goes to HTTPConfig.URL with its placeholders filled from the
// message ([URLTemplate]); a message that lacks what they reference fails
// with a permanent SinkError wrapping [shaper.ErrInvalidMessage] before
// anything is sent (dead letter "invalid"). It carries:
//   - the body: Message.Data, unchanged;
//   - the configured headers;
//   - Authorization, when HTTPConfig.Auth is set (auth.go: a token of a
//     file or of an OAuth2 endpoint; one retry in the same Send after a 401);
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
//     logged at debug level with its name only;
//   - with HTTPConfig.Signing, the Standard Webhooks headers webhook-id
//     (Message.Key()), webhook-timestamp and webhook-signature (signing.go).
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
	direct    *direct         // gated HTTP/1.1 requests on the task's goroutine (direct.go); with transport
	url       *URLTemplate
	signer    *signer // nil: no signing
	method    string
	what      string // "http <method>", the prefix of Send's errors
	basic     string // "Basic …" from the URL's user info, "" without
	host      string
	headers   http.Header
	success   statusSet
	retryable statusSet
	logger    *slog.Logger
	now       func() time.Time
	gate      gate
	auth      authorizer   // nil: sink.auth none
	tls       *tlsReloader // nil: no sink.tls
}

// NewHTTP returns an HTTP sink for cfg. It checks cfg and returns every
// problem at once (errors.Join), each prefixed with its key relative to the
// sink (url, method, headers.<name>, success_status[i], retryable_status[i],
// auth.*, tls.*: [CheckAuth], [CheckTLS])
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
		method:  cfg.Method,
		headers: make(http.Header, len(cfg.Headers)),
		logger:  o.logger,
		now:     o.now,
	}
	if errs := s.configure(cfg); len(errs) > 0 {
		return nil, fmt.Errorf("sinks: http: %w", errors.Join(errs...))
	}
	if err := s.startAuthTLS(cfg); err != nil {
		return nil, fmt.Errorf("sinks: http: %w", err)
	}

	if cfg.Client != nil {
		s.client = cfg.Client
		return s, nil
	}
	s.transport = newTransport(o.maxIdle)
	s.direct = newDirect(o.maxIdle)
	if s.tls != nil {
		s.transport.TLSClientConfig = s.tls.config()
		s.tls.transport.Store(s.transport)
	}
	s.client = &http.Client{
		Transport: s.transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return s, nil
}

// newTransport is the HTTP sink's own transport: maxIdle idle connections
// per host, wire reports from its connections (wireDialer).
func newTransport(maxIdle int) *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: wireDialer(&net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
		}),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          maxIdle,
		MaxIdleConnsPerHost:   maxIdle,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// No Accept-Encoding: gzip that Go's transport would add on its
		// own: the downstream receives only the headers the README lists
		// (issue 12); only a short snippet of an error body is read.
		DisableCompression: true,
	}
}

// wireConn reports, once per request, when a Write of the connection
// returned: the request left for the downstream (shaper.WithWire). HTTP/1.1
// sends one request at a time on a connection, and the transport flushes a
// request with small body in one Write.
type wireConn struct {
	net.Conn
	pending atomic.Pointer[wireTrace]
	// loopback: the peer is on this host's loopback, where the kernel
	// stamps a segment's arrival inside the write that sends it.
	loopback bool
	sent     *sentProbe // what of a write is not yet sent (sent_linux.go)
}

func (c *wireConn) Write(b []byte) (int, error) {
	if t := c.pending.Load(); t != nil {
		// The request's first byte waits for its departure (shaper.Gate);
		// nothing is written once the task's context ended.
		if err := t.openGate(); err != nil {
			c.pending.Store(nil)
			return 0, err
		}
	}
	n, err := c.Conn.Write(b)
	if t := c.pending.Swap(nil); t != nil && err == nil {
		c.sent.awaitSent(t.ctx, n) // its first byte on the wire, not only in the send queue
		t.report(time.Now(), t.exact)
	}
	return n, err
}

func wireDialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tcp, _ := c.RemoteAddr().(*net.TCPAddr)
		return &wireConn{Conn: c, loopback: tcp != nil && tcp.IP.IsLoopback(), sent: newSentProbe(c)}, nil
	}
}

// wireTrace reports when one request is on the wire (shaper.WithWire): when
// the connection's Write of it returned. WroteRequest alone is too early — it
// fires when the request is in the connection's buffer, before the
// transport's writer goroutine flushes it, and that goroutine can be
// descheduled in between (measured: 1 ms). It is the fallback for a
// caller-supplied Client, whose connections are not ours. One allocation
// holds the trace and its state.
type wireTrace struct {
	trace httptrace.ClientTrace
	ctx   context.Context // the task's
	wire  func(time.Time, bool)
	// gate, when the lane gates writes (shaper.WithGate): openGate waits
	// at it before the first byte of each attempt's write.
	gate shaper.Gate
	// reported: the request was reported written; another attempt to
	// write it (a retry on a fresh connection) yields first (openGate).
	reported atomic.Bool
	how      atomic.Uint32 // reportAtRequest, reportAtWrite or reportAtHeaders
	// exact, with reportAtWrite: the report will be this request's own
	// write, whole, to a loopback peer (shaper.WithWire).
	exact bool
}

// How a wireTrace reports its request (set by gotConn).
const (
	reportAtRequest uint32 = iota // WroteRequest: a caller's client; the request in its buffer
	reportAtWrite                 // the Write of a wireConn of ours: HTTP/1.1
	reportAtHeaders               // WroteHeaders: HTTP/2
)

func newWireTrace(ctx context.Context, wire func(time.Time, bool), gate shaper.Gate) *wireTrace {
	t := &wireTrace{ctx: ctx, wire: wire, gate: gate}
	t.trace.GotConn = t.gotConn
	t.trace.WroteHeaders = t.wroteHeaders
	t.trace.WroteRequest = t.wroteRequest
	return t
}

// directKey carries a gated request's wireTrace to send, which writes the
// request on the task's goroutine when it can (direct.go).
type directKey struct{}

// openGate waits at the gate before an attempt's first byte (the
// goroutine that writes the request calls it: one at a time). A request
// already reported written is being sent again (the transport's retry on a
// fresh connection): it yields first, and waits for a departure of its own.
// It returns the task's context's error when that ended: nothing may be
// written then.
func (t *wireTrace) openGate() error {
	g := t.gate
	if g == nil {
		return nil
	}
	if t.reported.Load() {
		g.Yield()
	}
	g.Wait()
	return t.ctx.Err()
}

// report reports the request on the wire at at (shaper.WithWire).
func (t *wireTrace) report(at time.Time, exact bool) {
	t.reported.Store(true)
	t.wire(at, exact)
}

func (t *wireTrace) gotConn(info httptrace.GotConnInfo) {
	c := info.Conn
	if tc, ok := c.(*tls.Conn); ok {
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			// HTTP/2 multiplexes requests on one connection: its next write
			// may be another stream's or a frame of its own, or come after
			// the response (a request on a reused connection went
			// unreported, and the lane held its next departure until the
			// task ended). WroteHeaders reports it, not exact; not
			// WroteRequest, which carries an error when the server answered
			// before the body was all sent (a CI run saw no report so).
			t.how.Store(reportAtHeaders)
			t.openGate() // nothing of the request is written before GotConn returns
			return
		}
		c = tc.NetConn()
	}
	if wc, ok := c.(*wireConn); ok {
		t.exact = wc.loopback
		t.how.Store(reportAtWrite)
		wc.pending.Store(t) // its Write opens the gate
		return
	}
	t.openGate() // a connection that is not ours: here, before any write
}

func (t *wireTrace) wroteHeaders() {
	if t.how.Load() == reportAtHeaders {
		t.report(time.Now(), false)
	}
}

func (t *wireTrace) wroteRequest(info httptrace.WroteRequestInfo) {
	if info.Err == nil && t.how.Load() == reportAtRequest {
		t.report(time.Now(), false) // in the buffer, maybe not yet written
	}
}

// send sends req through the sink's own transport directly, or through
// HTTPConfig.Client when one was given. The sink's own client would add
// nothing but CPU on every request (issue 15: its redirect loop, the copy of
// the headers kept for redirects, its deadline plumbing): it follows no
// redirect (a 3xx is classified like any other status) and has no overall
// timeout (ctx bounds the call). What it would do that matters is done here:
// the URL's user info is sent as basic auth unless an Authorization header is
// set (as http.Client does); errors carry no URL either way (stripURL).
func (s *HTTP) send(req *http.Request) (*http.Response, error) {
	if s.transport == nil || s.client.Transport != s.transport {
		return s.client.Do(req)
	}
	if s.basic != "" && req.Header.Get(AuthorizationHeader) == "" {
		req.Header[AuthorizationHeader] = []string{s.basic}
	}
	if wt, _ := req.Context().Value(directKey{}).(*wireTrace); wt != nil && wt.gate != nil && s.directs(req) {
		// Request.Write calls the trace's WroteHeaders and WroteRequest
		// while serializing, before the gate: they must not report.
		wt.how.Store(reportAtWrite)
		return s.direct.roundTrip(req, wt)
	}
	return s.transport.RoundTrip(req)
}

// ReportsWire reports true: Send calls the function of shaper.WithWire when
// the request has been written to the connection (drain.WireReporter).
func (s *HTTP) ReportsWire() bool { return true }

// GatesWire reports true when the sink sends through its own transport
// (no HTTPConfig.Client): then no byte of a request is written before the
// function of shaper.WithGate returns (drain.WireGater): in the
// connection's Write for HTTP/1.1, in GotConn for HTTP/2. A caller's
// client may write before any hook of ours runs.
func (s *HTTP) GatesWire() bool { return s.transport != nil && s.client.Transport == s.transport }

// Send delivers m as one request and classifies the response (see [HTTP]).
// It returns nil on success, otherwise a *shaper.SinkError.
func (s *HTTP) Send(ctx context.Context, m *shaper.Message) error {
	if !s.gate.enter() {
		return retryable("http", ErrClosed)
	}
	defer s.gate.leave()
	what := s.what
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
		wt := newWireTrace(ctx, wire, shaper.GateFrom(ctx))
		rctx = httptrace.WithClientTrace(ctx, &wt.trace)
		if wt.gate != nil && wt.gate.Early() && s.direct != nil {
			rctx = context.WithValue(rctx, directKey{}, wt) // send may write it itself (direct.go)
		}
	}
	target, err := s.url.Expand(m)
	if err != nil { // the message lacks what sink.url references: dead letter invalid
		return &shaper.SinkError{Permanent: true, Err: fmt.Errorf("%s: %w", what, err)}
	}
	req, err := http.NewRequestWithContext(rctx, s.method, target, bytes.NewReader(m.Data))
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
	s.forwardNATSHeaders(h, m)
	// The sink's own headers, in one allocation (canonical names: set as
	// h.Set would).
	own := [...]string{key, m.Subject, strconv.FormatUint(m.NumDelivered, 10)}
	vals := own[:]
	h[IdempotencyKeyHeader], h[SubjectHeader], h[DeliveryHeader] = vals[0:1:1], vals[1:2:2], vals[2:3:3]
	if s.signer != nil {
		s.signer.sign(h, key, s.now(), m.Data) // last: at the send (signing.go)
	}

	resp, err := s.do(ctx, req) // with sink.auth's header (auth.go)
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
	return s.classify(what, resp, req)
}

// classify turns a response into Send's result. It drains and closes the
// body so the connection goes back to the keep-alive pool.
func (s *HTTP) classify(what string, resp *http.Response, req *http.Request) error {
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
		msg += fmt.Sprintf(": response body %q", redactEcho(snippet, req))
	}
	e.Err = errors.New(msg)
	return e
}

// redactEcho returns body with every value the request carried that may be
// a secret replaced by [redacted]: its header values (the sink's headers
// come from ${ENV}, sink.auth's token, the URL's basic credentials; a
// Bearer or Basic value also without its scheme) and its URL's password and
// query values. Values under 4 bytes are left. A downstream that echoed a
// bad API key in its 401 body showed the key in the dead letters, the admin
// API and `shaper lanes` (a new-user pass; the README: expanded values never
// appear in errors).
func redactEcho(body []byte, req *http.Request) []byte {
	if req == nil {
		return body
	}
	var vals []string
	for name, vs := range req.Header {
		switch name {
		case IdempotencyKeyHeader, SubjectHeader, DeliveryHeader: // the job's own, not secrets
			continue
		}
		for _, v := range vs {
			vals = append(vals, v)
			scheme, rest, ok := strings.Cut(v, " ")
			if ok {
				vals = append(vals, rest)
			}
			if strings.EqualFold(scheme, "Basic") { // user:password
				if b, err := base64.StdEncoding.DecodeString(rest); err == nil {
					if _, pw, ok := strings.Cut(string(b), ":"); ok {
						vals = append(vals, pw)
					}
				}
			}
		}
	}
	if u := req.URL; u != nil {
		if p, ok := u.User.Password(); ok {
			vals = append(vals, p)
		}
		for _, vs := range u.Query() {
			vals = append(vals, vs...)
		}
	}
	slices.SortFunc(vals, func(a, b string) int { return len(b) - len(a) }) // the longest first
	for _, v := range vals {
		if len(v) >= 4 {
			body = bytes.ReplaceAll(body, []byte(v), []byte("[redacted]"))
		}
	}
	return body
}

// forwardNATSHeaders copies the job's NATS headers into h as X-Nats-<Name>,
// skipping NATS's own headers (except Nats-Msg-Id) and those HTTP cannot
// carry.
//
// A replayed dead letter travels under a Nats-Msg-Id of its own
// (sources.DeadLetters.Replay); its X-Nats-Msg-Id is the one the job was
// first published with (shaper.OrigMsgIDHeader), or none when it had none.
func (s *HTTP) forwardNATSHeaders(h http.Header, m *shaper.Message) {
	ctTried := false
	_, replay := m.HeaderValue(shaper.ReplayOfHeader)
	for name, v := range m.HeaderPairs() { // packed or not (ReadsPackedHeaders)
		var key string
		switch {
		case strings.EqualFold(name, shaper.MsgIDHeader):
			if replay {
				continue
			}
			key = NATSHeaderPrefix + "Msg-Id"
		case strings.EqualFold(name, shaper.OrigMsgIDHeader):
			if !replay {
				continue // set by shaper on dead letters and replays only
			}
			key = NATSHeaderPrefix + "Msg-Id"
		case hasPrefixFold(name, "Nats-"):
			continue
		case !isToken(name):
			s.logger.Debug("sink skipped a NATS header with a name HTTP cannot carry", "header", name)
			continue
		default:
			key = http.CanonicalHeaderKey(NATSHeaderPrefix + name)
		}
		if !validHeaderValue(v) {
			s.logger.Debug("sink skipped a NATS header value HTTP cannot carry", "header", name)
			continue
		}
		h[key] = append(h[key], v)
		// The producer's Content-Type describes the body, which is sent as
		// it is: pass its first value on as the request's own, unless
		// sink.headers set one.
		if !ctTried && strings.EqualFold(name, "Content-Type") {
			ctTried = true
			if h.Get("Content-Type") == "" {
				h.Set("Content-Type", v)
			}
		}
	}
}

// ReadsPackedHeaders implements drain.PackedHeaderReader: the sink reads
// a message's headers through its accessors only.
func (s *HTTP) ReadsPackedHeaders() bool { return true }

// Close waits for Sends in progress, then closes the idle connections of
// the sink's own transport (a caller's HTTPConfig.Client is left alone).
// It always returns nil; later calls return at once.
func (s *HTTP) Close() error {
	if s.gate.close() {
		s.stopAuthTLS()
		if s.transport != nil {
			s.transport.CloseIdleConnections()
			if s.direct != nil {
				s.direct.closeIdle()
			}
		}
	}
	return nil
}

// statusSet is a set of HTTP status codes 100–599.
// stripURL removes the *url.Error layer, whose text repeats the request URL
// (which may carry credentials), and keeps its cause.
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
