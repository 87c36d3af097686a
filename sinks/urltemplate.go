package sinks

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/shaper-dev/shaper/shaper"
)

// URLTemplate is the per-message address of an HTTP sink (SPEC §3
// Per-message address): sink.url whose path and query may hold placeholders
// filled from each message, so that one lane — one limit — serves many
// endpoints of one downstream:
//
//   - {header:NAME}: the first value of the message's header NAME (an RFC
//     9110 token; looked up exactly, then case-insensitively);
//   - {subject:N}: token N of the message's subject, counted from 0 (in
//     "bb.x.m1", {subject:2} is "m1").
//
// A value is escaped for where it stands: path-escaped in the path (a "/"
// becomes %2F, so a value is always one path segment), query-escaped in the
// query (so it cannot add parameters). The scheme, user info, host and port
// are literal: a placeholder there is rejected by [ParseURLTemplate], so
// where requests go is never decided by a message. Any "{" starts a
// placeholder; write a literal brace as %7B / %7D.
//
// A URLTemplate is immutable and safe for concurrent use.
type URLTemplate struct {
	raw    string    // the URL as written, when it has no placeholders
	prefix string    // scheme://authority, literal
	parts  []urlPart // path and query, in order
	refs   []string  // the placeholders, as written
	frag   string    // "#..." or "", literal
}

// urlPart is a literal run or a placeholder of a URLTemplate.
type urlPart struct {
	lit     string // literal text (kind partLiteral)
	kind    partKind
	header  string // kind partHeader
	token   int    // kind partSubject
	inQuery bool   // escaping: query (true) or path (false)
	text    string // the placeholder as written, "{header:merchant}"
}

type partKind int

const (
	partLiteral partKind = iota
	partHeader
	partSubject
)

// ParseURLTemplate parses raw, an absolute http or https URL whose path and
// query may use {header:NAME} and {subject:N} (see [URLTemplate]). The
// error says what is wrong and quotes only the placeholder at fault, never
// raw, which may carry credentials; it reads well after "url: ".
func ParseURLTemplate(raw string) (*URLTemplate, error) {
	t := &URLTemplate{}
	schemeEnd := strings.Index(raw, "://")
	if schemeEnd < 0 {
		if strings.Contains(raw, "{") {
			return nil, errors.New("must be an absolute http or https URL (placeholders only in its path and query)")
		}
		return nil, errors.New("must be an absolute http or https URL")
	}
	authEnd := len(raw)
	if i := strings.IndexAny(raw[schemeEnd+3:], "/?#"); i >= 0 {
		authEnd = schemeEnd + 3 + i
	}
	if i := strings.IndexAny(raw[:authEnd], "{}"); i >= 0 {
		return nil, fmt.Errorf("placeholder %s in the scheme, host or port: placeholders may be used only in the path and query, so a message never chooses where requests go",
			placeholderAt(raw, i))
	}
	t.prefix = raw[:authEnd]
	rest := raw[authEnd:]
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		t.frag = rest[i:]
		rest = rest[:i]
		if j := strings.IndexAny(t.frag, "{}"); j >= 0 {
			return nil, fmt.Errorf("placeholder %s in the fragment: placeholders may be used only in the path and query", placeholderAt(t.frag, j))
		}
	}
	inQuery := false
	for rest != "" {
		i := strings.IndexAny(rest, "{}?")
		if i < 0 {
			t.parts = append(t.parts, urlPart{lit: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, urlPart{lit: rest[:i]})
		}
		switch rest[i] {
		case '?':
			inQuery = true
			t.parts = append(t.parts, urlPart{lit: "?"})
			rest = rest[i+1:]
			continue
		case '}':
			return nil, errors.New(`a "}" without its "{": write a literal brace as %7D`)
		}
		end := strings.IndexByte(rest[i:], '}')
		if end < 0 {
			return nil, errors.New(`a "{" without its "}": want {header:NAME} or {subject:N} (write a literal brace as %7B)`)
		}
		text := rest[i : i+end+1]
		p, err := parsePlaceholder(text)
		if err != nil {
			return nil, err
		}
		p.inQuery, p.text = inQuery, text
		t.parts = append(t.parts, p)
		t.refs = append(t.refs, text)
		rest = rest[i+end+1:]
	}
	// The sample stands for every expansion: a placeholder becomes one
	// escaped value, which cannot change how the rest of the URL parses.
	sample := t.prefix
	for _, p := range t.parts {
		if p.kind == partLiteral {
			sample += p.lit
		} else {
			sample += "x"
		}
	}
	u, err := url.Parse(sample + t.frag)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("must be an absolute http or https URL")
	}
	if len(t.refs) == 0 {
		t.raw = raw
	}
	return t, nil
}

// placeholderAt returns the placeholder of s that starts (or ends) at i, for
// an error message: up to its closing brace, at most 40 bytes; it never
// returns more of s than that.
func placeholderAt(s string, i int) string {
	if s[i] == '}' {
		return `"}"`
	}
	end := strings.IndexByte(s[i:], '}')
	if end < 0 || end > 40 {
		return `"{"`
	}
	return s[i : i+end+1]
}

// parsePlaceholder parses "{header:NAME}" or "{subject:N}".
func parsePlaceholder(text string) (urlPart, error) {
	kind, arg, ok := strings.Cut(text[1:len(text)-1], ":")
	switch {
	case !ok:
	case kind == "header":
		if !isToken(arg) {
			return urlPart{}, fmt.Errorf("placeholder %s: %q is not a valid header name", text, arg)
		}
		return urlPart{kind: partHeader, header: arg}, nil
	case kind == "subject":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 0 || !allDigits(arg) {
			return urlPart{}, fmt.Errorf("placeholder %s: want a subject token number 0, 1, 2, …", text)
		}
		return urlPart{kind: partSubject, token: n}, nil
	}
	return urlPart{}, fmt.Errorf("unknown placeholder %s: want {header:NAME} or {subject:N} (write a literal brace as %%7B)", text)
}

// HasPlaceholders reports whether the URL depends on the message.
func (t *URLTemplate) HasPlaceholders() bool { return len(t.refs) > 0 }

// Placeholders returns the placeholders of the template as written, in
// order ("{header:merchant}", "{subject:2}").
func (t *URLTemplate) Placeholders() []string { return append([]string(nil), t.refs...) }

// SubjectTokens returns the highest {subject:N} token number the template
// uses, or -1 when it uses none: config checks it against the lane's
// source.subjects.
func (t *URLTemplate) SubjectTokens() int {
	most := -1
	for _, p := range t.parts {
		if p.kind == partSubject {
			most = max(most, p.token)
		}
	}
	return most
}

// Expand returns the URL for m. When m lacks what a placeholder needs — the
// header is missing or empty, the subject has too few tokens, or a path
// value is "." or ".." (which would climb the path) — it returns an error
// wrapping [shaper.ErrInvalidMessage] that names the placeholder and never
// the URL.
func (t *URLTemplate) Expand(m *shaper.Message) (string, error) {
	if t.raw != "" {
		return t.raw, nil
	}
	var b strings.Builder
	b.Grow(len(t.prefix) + 64)
	b.WriteString(t.prefix)
	for _, p := range t.parts {
		var v string
		switch p.kind {
		case partLiteral:
			b.WriteString(p.lit)
			continue
		case partHeader:
			v = m.HeaderFirst(p.header)
			if v == "" {
				return "", fmt.Errorf("sink.url %s: the message has no header %q (or it is empty): %w", p.text, p.header, shaper.ErrInvalidMessage)
			}
		case partSubject:
			v = subjectToken(m.Subject, p.token)
			if v == "" {
				return "", fmt.Errorf("sink.url %s: the subject has %d tokens, no token %d: %w",
					p.text, strings.Count(m.Subject, ".")+1, p.token, shaper.ErrInvalidMessage)
			}
		}
		if p.inQuery {
			b.WriteString(url.QueryEscape(v))
			continue
		}
		if v == "." || v == ".." {
			return "", fmt.Errorf("sink.url %s: the value %q would climb the path: %w", p.text, v, shaper.ErrInvalidMessage)
		}
		b.WriteString(url.PathEscape(v))
	}
	b.WriteString(t.frag)
	return b.String(), nil
}

// subjectToken returns token n of subject (from 0), "" when there is none.
func subjectToken(subject string, n int) string {
	for i := 0; subject != ""; i++ {
		tok, rest, more := strings.Cut(subject, ".")
		if i == n {
			return tok
		}
		if !more {
			break
		}
		subject = rest
	}
	return ""
}
