package config

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
)

// envRef finds ${NAME} references in the raw file.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandSecrets replaces ${NAME} references by the environment in the keys
// that may hold secrets, and remembers the original text so messages and
// Redacted never show the expanded value.
//
// With optional (SecretsOptional), a reference to an unset or empty
// variable is a warning instead, and the key's own rules are skipped: the
// key keeps its ${NAME} text.
func expandSecrets(p *problems, c *Config, optional bool) (warns []Warning) {
	c.templates = map[string]string{}
	expand := func(key string, s *string) {
		out, changed, err := expandEnv(*s)
		var unset *unsetEnvError
		switch {
		case err != nil && optional && errors.As(err, &unset):
			p.failed[key] = true // its rules would judge the ${NAME} text
			warns = append(warns, Warning{Key: key, Message: err.Error() + ": not needed by this command, left unexpanded"})
		case err != nil:
			p.fail(key, err.Error())
		}
		if changed {
			c.templates[key] = *s
			if err == nil {
				*s = out
			}
		}
	}
	expand("nats.url", &c.NATS.URL)
	expand("redis.addr", &c.Redis.Addr)
	expand("redis.username", &c.Redis.Username)
	expand("redis.password", &c.Redis.Password)
	expand("admin.token", &c.Admin.Token)
	for name, l := range c.Downstreams {
		prefix := "downstreams." + name + ".sink."
		expand(prefix+"url", &l.Sink.URL)
		if l.Sink.Headers != nil {
			headers := make(map[string]string, len(l.Sink.Headers))
			for h, val := range l.Sink.Headers {
				expand(prefix+"headers."+h, &val)
				headers[h] = val
			}
			l.Sink.Headers = headers
		}
		expandAuth(prefix, &l.Sink.Auth, expand) // sink_auth.go
		c.Downstreams[name] = l
	}
	expandSigning(c, expand) // config/signing.go
	return warns
}

// unsetEnvError is expandEnv's error for references to variables that are
// unset or empty (as opposed to a malformed reference).
type unsetEnvError struct{ msg string }

func (e *unsetEnvError) Error() string { return e.msg }

// expandEnv replaces each ${NAME} in s by the value of the environment
// variable NAME. changed reports whether s holds any reference. The error
// names the variables that are unset or empty, never a value.
func expandEnv(s string) (out string, changed bool, err error) {
	if !strings.Contains(s, "${") {
		return s, false, nil
	}
	var b strings.Builder
	var missing []string
	rest := s
	for {
		i := strings.Index(rest, "${")
		if i < 0 {
			b.WriteString(rest)
			break
		}
		b.WriteString(rest[:i])
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return s, true, errors.New("unterminated ${ reference")
		}
		name := rest[i+2 : i+j]
		if !isEnvName(name) {
			return s, true, fmt.Errorf("${%s} is not a valid reference: want ${NAME} with NAME of letters, digits and _", name)
		}
		val, ok := os.LookupEnv(name)
		if !ok || val == "" {
			if !slices.Contains(missing, name) {
				missing = append(missing, name)
			}
		}
		b.WriteString(val)
		rest = rest[i+j+1:]
	}
	if len(missing) > 0 {
		refs := make([]string, len(missing))
		for i, n := range missing {
			refs[i] = "${" + n + "}"
		}
		return s, true, &unsetEnvError{fmt.Sprintf("environment variable referenced by %s is not set (or empty)", strings.Join(refs, ", "))}
	}
	return b.String(), true, nil
}

func isEnvName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// redactedValue is what Redacted shows in place of a secret it cannot show
// as its ${ENV} reference.
const redactedValue = "[REDACTED]"

// Redacted returns a deep copy of c that is safe to log or print: every
// value that came from ${ENV} references is replaced by the reference text
// ("Bearer ${PAYMENTS_TOKEN}"), passwords in URLs are masked, and literal
// header values whose name suggests a credential (Authorization, Cookie,
// *token*, *secret*, *key*, *pass*, *auth*) are replaced by "[REDACTED]".
// c itself is not modified. Redacted of nil is nil.
func (c *Config) Redacted() *Config {
	if c == nil {
		return nil
	}
	r := *c
	r.templates = maps.Clone(c.templates)
	r.NATS.URL = c.shownRaw("nats.url", c.NATS.URL)
	r.Redis.Addr = c.shownRaw("redis.addr", c.Redis.Addr)
	r.Redis.Username = c.shownRaw("redis.username", c.Redis.Username)
	if tmpl, ok := c.templates["redis.password"]; ok {
		r.Redis.Password = tmpl
	} else if c.Redis.Password != "" {
		r.Redis.Password = redactedValue
	}
	if tmpl, ok := c.templates["admin.token"]; ok {
		r.Admin.Token = tmpl
	} else if c.Admin.Token != "" {
		r.Admin.Token = redactedValue
	}
	r.Downstreams = make(map[string]Lane, len(c.Downstreams))
	for name, l := range c.Downstreams {
		prefix := "downstreams." + name + ".sink."
		l.Source.Subjects = slices.Clone(l.Source.Subjects)
		l.Task.Retry.Backoff = slices.Clone(l.Task.Retry.Backoff)
		l.Sink.SuccessStatus = slices.Clone(l.Sink.SuccessStatus)
		l.Sink.RetryableStatus = slices.Clone(l.Sink.RetryableStatus)
		l.Sink.URL = c.shownRaw(prefix+"url", l.Sink.URL)
		l.Sink.Signing.Secrets = c.redactedSigning(name, l.Sink.Signing.Secrets)
		if l.Sink.Headers != nil {
			headers := make(map[string]string, len(l.Sink.Headers))
			for h, val := range l.Sink.Headers {
				key := prefix + "headers." + h
				switch tmpl, ok := c.templates[key]; {
				case ok:
					headers[h] = tmpl
				case sensitiveHeader(h):
					headers[h] = redactedValue
				default:
					headers[h] = val
				}
			}
			l.Sink.Headers = headers
		}
		l.Sink.Auth = c.redactedAuth(prefix, l.Sink.Auth) // sink_auth.go
		r.Downstreams[name] = l
	}
	return &r
}

// shownRaw returns the text of a URL or address key that is safe to show:
// its ${ENV} reference when it had one, else the value with any password
// masked.
func (c *Config) shownRaw(key, value string) string {
	if tmpl, ok := c.templates[key]; ok {
		return tmpl
	}
	return maskPassword(value)
}

// maskPassword is RedactURL, for the loader's messages.
func maskPassword(s string) string { return RedactURL(s) }

// RedactedSecret is what RedactURL puts in place of a password, a token
// user name or a credential query value.
const RedactedSecret = "***"

// RedactURL returns s, a URL or a comma-separated list of them (nats.url's
// seeds, redis.addr, sink.url), safe to log or show: the password of each is
// replaced by [RedactedSecret] ("nats://bob:hunter2@h:4222" →
// "nats://bob:***@h:4222"), a user name without a password, which may be a
// token ("https://TOKEN@h"), too, and so are the values of query parameters
// whose name suggests a credential (password, token, secret, key, auth…). An
// item with an "@" that does not parse as a URL with a host keeps only what
// follows its last "@". Items without credentials are returned unchanged.
// Every log line, metric and API answer that shows one of these keys goes
// through it (issue 12).
func RedactURL(s string) string {
	if !strings.ContainsAny(s, "@?") {
		return s
	}
	parts := strings.Split(s, ",")
	for i, part := range parts {
		parts[i] = redactOne(part)
	}
	return strings.Join(parts, ",")
}

func redactOne(part string) string {
	lead := part[:len(part)-len(strings.TrimLeft(part, " \t"))]
	item := strings.TrimSpace(part)
	u, err := url.Parse(item)
	if err != nil || u.Host == "" || u.Opaque != "" {
		if at := strings.LastIndex(item, "@"); at >= 0 {
			return lead + RedactedSecret + "@" + item[at+1:]
		}
		return part
	}
	changed := false
	if q := u.Query(); len(q) > 0 {
		for k := range q {
			if sensitiveHeader(k) {
				q[k] = []string{RedactedSecret}
				changed = true
			}
		}
		if changed {
			u.RawQuery = strings.ReplaceAll(q.Encode(), url.QueryEscape(RedactedSecret), RedactedSecret)
		}
	}
	if u.User == nil {
		if !changed {
			return part
		}
		return lead + u.String()
	}
	user := RedactedSecret
	if _, has := u.User.Password(); has {
		user = url.User(u.User.Username()).String() + ":" + RedactedSecret
	}
	u.User = nil
	out := u.String()
	// u.String() without the user info is scheme://host...: put it back,
	// unescaped, after the scheme.
	if pre := u.Scheme + "://"; strings.HasPrefix(out, pre) {
		return lead + pre + user + "@" + out[len(pre):]
	}
	return lead + RedactedSecret + "@" + u.Host
}

func sensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"authorization", "cookie", "token", "secret", "key", "pass", "auth", "signature", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// unreadFiles is SecretsOptional's rule for files: each credentials, TLS or
// token file the config names that cannot be opened is a warning that
// names the key and the error, and the key's rules are skipped (the
// validator's check of nats.creds and nats.tls, the sink's CheckTLS and
// CheckAuth on the block). A file that opens is judged as always.
func unreadFiles(p *problems, c *Config) (warns []Warning) {
	try := func(key, path string) {
		if path == "" || p.skip(key) {
			return
		}
		f, err := os.Open(path)
		if err == nil {
			_ = f.Close()
			return
		}
		p.failed[key] = true
		warns = append(warns, Warning{Key: key, Message: fmt.Sprintf("cannot be read (%v): not needed by this command, its rules skipped", err)})
	}
	try("nats.creds", c.NATS.Creds)
	try("nats.tls.ca_file", c.NATS.TLS.CAFile)
	try("nats.tls.cert_file", c.NATS.TLS.CertFile)
	try("nats.tls.key_file", c.NATS.TLS.KeyFile)
	for _, name := range slices.Sorted(maps.Keys(c.Downstreams)) {
		s := c.Downstreams[name].Sink
		prefix := "downstreams." + name + ".sink."
		try(prefix+"tls.ca_file", s.TLS.CAFile)
		try(prefix+"tls.cert_file", s.TLS.CertFile)
		try(prefix+"tls.key_file", s.TLS.KeyFile)
		if s.Auth.Kind == SinkAuthBearerFile {
			try(prefix+"auth.path", s.Auth.Path)
		}
	}
	return warns
}

// unexpandedRefs warns about each ${NAME} in a key that does not expand
// references (only the keys that may hold secrets do: expandSecrets): its
// value is used as written, so a source.stream of "${STREAM}" would name a
// stream "${STREAM}" (found by a new-user pass). settings is viper's
// nested map of the merged config.
func unexpandedRefs(c *Config, settings map[string]any) (warns []Warning) {
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(x)) {
				walk(strings.TrimPrefix(key+"."+k, "."), x[k])
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", key, i), e)
			}
		case []string:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", key, i), e)
			}
		case string:
			if _, expanded := c.templates[key]; expanded {
				return
			}
			if m := envRef.FindString(x); m != "" {
				warns = append(warns, Warning{Key: key, Message: m + " is not expanded in this key (only the keys that may hold secrets take ${ENV}: docs/configuration.md): the value is used as written"})
			}
		}
	}
	walk("", settings)
	return warns
}
