package sinks

// The HTTP sink's checks of its configuration (HTTPConfig), run by NewHTTP:
// the URL, the method, the configured headers and the status sets.

import (
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// CheckHTTP returns every problem of cfg's URL, method, headers and status
// sets, each with its key relative to the sink (url, method,
// headers.<name>, success_status[i], retryable_status[i]). A message never
// quotes the URL nor a header's value (both may be secret). NewHTTP runs
// these checks, and config calls CheckHTTP to report them with their key
// paths at load (SPEC §7: the HTTP sink's checks live in sinks). An empty
// SuccessStatus means 2xx; sink.auth, sink.tls and sink.signing have checks
// of their own (CheckAuth, CheckTLS, ParseWebhookSecret).
func CheckHTTP(cfg HTTPConfig) []*ConfigProblem {
	var ps []*ConfigProblem
	add := func(key, format string, args ...any) {
		ps = append(ps, &ConfigProblem{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	switch u, err := url.Parse(cfg.URL); {
	case cfg.URL == "":
		add("url", "required for sink kind http (an http:// or https:// URL)")
	case strings.ContainsAny(cfg.URL, "{}"): // a per-message address: urltemplate.go
		if _, err := ParseURLTemplate(cfg.URL); err != nil {
			add("url", "%v", err)
		}
	case err != nil:
		add("url", "is not a valid URL")
	case u.Scheme == "":
		add("url", "has no scheme: want an http:// or https:// URL")
	case u.Scheme != "http" && u.Scheme != "https":
		add("url", "scheme must be http or https")
	case u.Host == "":
		add("url", "has no host")
	}
	if m := cfg.Method; m != "" && !isToken(m) {
		add("method", "%q is not a valid HTTP method", m)
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Headers)) {
		if err := checkConfiguredHeader(name, cfg.Headers[name]); err != nil {
			add("headers."+name, "%q %v", http.CanonicalHeaderKey(name), err)
		}
	}
	var set statusSet
	for i, v := range cfg.SuccessStatus {
		if err := set.addPattern(v); err != nil {
			add(fmt.Sprintf("success_status[%d]", i), "%q is not a status code 100-599 or a class 1xx-5xx", v)
		}
	}
	for i, code := range cfg.RetryableStatus {
		switch {
		case code < 100 || code > 599:
			add(fmt.Sprintf("retryable_status[%d]", i), "must be a status code 100-599, got %d", code)
		case set.has(code):
			// A response is a success first (SPEC §3 Retries): the code
			// would never be retried. A new-user pass listed 200 in both.
			add(fmt.Sprintf("retryable_status[%d]", i), "%d is also a success_status: such a response is acked, never retried; list it in one of the two", code)
		}
	}
	return ps
}

// configure checks cfg (CheckHTTP and the checks of auth, tls and signing)
// and fills s's URL, method, headers, host and status sets from it; it
// returns every problem found.
func (s *HTTP) configure(cfg HTTPConfig) []error {
	var errs []error
	for _, p := range CheckHTTP(cfg) {
		errs = append(errs, p)
	}
	s.url, _ = ParseURLTemplate(cfg.URL)    // checked above
	signer, serrs := newSigner(cfg.Signing) // signing.go
	s.signer, errs = signer, append(errs, serrs...)
	errs = append(errs, signer.reservedIn(cfg.Headers)...)
	if s.method == "" {
		s.method = DefaultMethod
	}
	for _, std := range standardMethods {
		if strings.EqualFold(s.method, std) {
			s.method = std
		}
	}
	s.what = "http " + s.method
	if s.url != nil { // the URL's user info, as basic auth (send)
		if u, err := url.Parse(s.url.prefix); err == nil && u.User != nil {
			password, _ := u.User.Password()
			s.basic = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+password))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Headers)) {
		value := cfg.Headers[name]
		switch {
		case checkConfiguredHeader(name, value) != nil: // reported by CheckHTTP
		case http.CanonicalHeaderKey(name) == "Host":
			s.host = value
		default:
			s.headers.Set(name, value)
		}
	}
	if s.headers.Get("User-Agent") == "" {
		s.headers.Set("User-Agent", "shaper")
	}
	success := cfg.SuccessStatus
	if len(success) == 0 {
		success = []string{"2xx"}
	}
	for _, v := range success {
		_ = s.success.addPattern(v) // checked by CheckHTTP
	}
	for _, code := range cfg.RetryableStatus {
		if code >= 100 && code <= 599 {
			s.retryable.add(code)
		}
	}
	for _, p := range append(CheckAuth(cfg.Auth, cfg.Headers), CheckTLS(cfg.TLS, cfg.URL)...) {
		errs = append(errs, p)
	}
	if !cfg.TLS.IsZero() && cfg.Client != nil {
		errs = append(errs, errors.New("tls: not with HTTPConfig.Client (configure its transport)"))
	}
	return errs
}

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

// standardMethods are the request methods the sink sends upper-cased
// whatever the case written (RFC 9110 §9.3, PATCH of RFC 5789); any other
// token is sent as written.
var standardMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions}

// StandardMethod reports whether m is one of the standard methods, in any
// case. The config warns about any other (a "GETT" passed validate and
// every request was answered 501, a new-user pass).
func StandardMethod(m string) bool {
	for _, std := range standardMethods {
		if strings.EqualFold(m, std) {
			return true
		}
	}
	return false
}

// isToken reports whether s is an RFC 9110 token (header names, methods).
func isToken(s string) bool { return httpguts.ValidHeaderFieldName(s) }

// validHeaderValue reports whether v can be sent as a header value: no
// control characters other than horizontal tab (RFC 9110 §5.5).
func validHeaderValue(v string) bool { return httpguts.ValidHeaderFieldValue(v) }

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
