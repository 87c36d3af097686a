package config

import (
	"strings"

	"github.com/shaper-dev/shaper/sinks"
)

// urlTemplate checks an http sink.url that uses placeholders (SPEC §3
// Per-message address) with the sink's own parser, sinks.ParseURLTemplate:
// placeholders only in the path and query, each one known. A {subject:N}
// must fit every source subject of the lane: a subject of fewer tokens
// without a trailing ">" could never fill it. Messages never quote the URL,
// which may carry credentials.
func (v *validator) urlTemplate(name, rawURL string, subjects []string) {
	key := "downstreams." + name + ".sink.url"
	t, err := sinks.ParseURLTemplate(rawURL)
	if err != nil {
		v.check(false, key, "%s", err)
		return
	}
	n := t.SubjectTokens()
	if n < 0 {
		return
	}
	for i, subj := range subjects {
		if badSubject(subj) != "" {
			continue // reported under source.subjects
		}
		toks := strings.Split(subj, ".")
		if toks[len(toks)-1] == ">" || n < len(toks) {
			continue
		}
		v.check(false, key, "{subject:%d} needs a subject of at least %d tokens, but source.subjects[%d] %q has %d (tokens count from 0)",
			n, n+1, i, subj, len(toks))
	}
}

// hasPlaceholders reports whether an http sink.url is a template: any
// brace makes it one (a literal brace is written %7B / %7D).
func hasPlaceholders(rawURL string) bool { return strings.ContainsAny(rawURL, "{}") }
