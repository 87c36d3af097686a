package sinks

// The HTTP sink's checks of its configuration (HTTPConfig), run by NewHTTP:
// the URL, the method, the configured headers and the status sets.

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// configure checks cfg and fills s's method, headers, host and status sets
// from it; it returns every problem found.
func (s *HTTP) configure(cfg HTTPConfig) []error {
	var errs []error
	var err error
	if s.url, err = ParseURLTemplate(cfg.URL); err != nil { // urltemplate.go
		errs = append(errs, fmt.Errorf("url: %w", err))
	}
	signer, serrs := newSigner(cfg.Signing) // signing.go
	s.signer, errs = signer, append(errs, serrs...)
	errs = append(errs, signer.reservedIn(cfg.Headers)...)
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

// isToken reports whether s is an RFC 9110 token (header names, methods).
func isToken(s string) bool { return httpguts.ValidHeaderFieldName(s) }

// validHeaderValue reports whether v can be sent as a header value: no
// control characters other than horizontal tab (RFC 9110 §5.5).
func validHeaderValue(v string) bool { return httpguts.ValidHeaderFieldValue(v) }

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
