package config

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shaper-dev/shaper/sources"
)

// Values of bucket.overflow (SPEC §3 Overflow).
const (
	// OverflowBlock fetches only into free slots; nothing is rejected.
	OverflowBlock = "block"
	// OverflowReject dead-letters a message that finds the bucket full or
	// whose projected wait exceeds bucket.max_wait.
	OverflowReject = "reject"
)

// Values of sink.kind.
const (
	SinkHTTP = "http" // POST (sink.method) to sink.url
	SinkNATS = "nats" // publish to sink.subject with a JetStream ack
	SinkLog  = "log"  // log each message; for trying shaper out
)

// laneNamePattern is the syntax of a lane name: it appears in metric labels,
// consumer names, subjects and environment variable names.
const laneNamePattern = "[a-z0-9_-]+"

var laneNameRE = regexp.MustCompile("^" + laneNamePattern + "$")

// Warning is a setting that is valid but probably not what the operator
// wants, such as an ack_wait shorter than the worst-case wait of a message
// (SPEC G7). Warnings never stop the daemon.
type Warning struct {
	// Key is the full key path, e.g. "downstreams.payments.source.ack_wait".
	Key string
	// Message says what is suspicious, with the numbers involved.
	Message string
}

// String formats w as "<key path>: warning: <message>".
func (w Warning) String() string { return w.Key + ": warning: " + w.Message }

// FieldError is one problem of a configuration. Load and Validate return
// every problem at once, each a *FieldError, joined with errors.Join.
type FieldError struct {
	// Key is the full key path, e.g. "downstreams.payments.rate.limit";
	// list items are written "source.subjects[1]".
	Key string
	// Message says what is wrong and quotes the offending value, except the
	// value of an ${ENV} reference, which is never shown.
	Message string
	// From names where the value came from when it was not the file: the
	// environment variable ("SHAPER_DOWNSTREAMS_PAYMENTS_RATE_LIMIT") or the
	// flag ("--log.level") that overrode the key; "" for the file and the
	// defaults (issue 12: a bad value from the environment was reported
	// under the file's key path alone).
	From string
}

// Error formats e as "<key path>: <what is wrong>", or "<key path> (from
// <origin>): <what is wrong>" when the value came from the environment or a
// flag.
func (e *FieldError) Error() string {
	if e.From != "" {
		return e.Key + " (from " + e.From + "): " + e.Message
	}
	return e.Key + ": " + e.Message
}

// problems collects the FieldErrors of one load or validation.
type problems struct {
	list []*FieldError
	seen map[FieldError]bool
	// failed holds the keys whose value did not load (unknown, wrong type,
	// bad ${ENV}); rules on them are skipped so a problem is reported once.
	failed map[string]bool
}

func newProblems() *problems {
	return &problems{seen: map[FieldError]bool{}, failed: map[string]bool{}}
}

// add records a problem with key.
func (p *problems) add(key, format string, args ...any) {
	fe := FieldError{Key: key, Message: fmt.Sprintf(format, args...)}
	if p.seen[fe] {
		return
	}
	p.seen[fe] = true
	p.list = append(p.list, &fe)
}

// fail records a problem with key whose value could not be loaded.
func (p *problems) fail(key, msg string) {
	p.failed[key] = true
	p.add(key, "%s", msg)
}

// skip reports whether a rule on key should be skipped because key, one of
// its parents or one of its children failed to load.
func (p *problems) skip(keys ...string) bool {
	for _, key := range keys {
		for f := range p.failed {
			if f == key || strings.HasPrefix(key, f+".") || strings.HasPrefix(key, f+"[") ||
				strings.HasPrefix(f, key+".") || strings.HasPrefix(f, key+"[") {
				return true
			}
		}
	}
	return false
}

// listed reports whether a problem was recorded for one of keys or for a
// key under one (a rule's or a load's): a warning derived from those values
// would quote a default or a value already reported as wrong.
func (p *problems) listed(keys ...string) bool {
	for _, key := range keys {
		for _, fe := range p.list {
			if fe.Key == key || strings.HasPrefix(fe.Key, key+".") || strings.HasPrefix(fe.Key, key+"[") {
				return true
			}
		}
	}
	return false
}

// attribute sets From on the problems whose key (or list key, for
// "key[i]") is in origin: key path → environment variable or flag.
func (p *problems) attribute(origin map[string]string) {
	for _, fe := range p.list {
		base, _, _ := strings.Cut(fe.Key, "[")
		if o, ok := origin[base]; ok {
			fe.From = o
		}
	}
}

// err returns the problems sorted by key (stable) and joined, or nil.
func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	list := slices.Clone(p.list)
	slices.SortStableFunc(list, func(a, b *FieldError) int { return cmp.Compare(a.Key, b.Key) })
	errs := make([]error, len(list))
	for i, fe := range list {
		errs[i] = fe
	}
	return errors.Join(errs...)
}

// MinLimit and MaxLimit bound rate.limit, in messages per second: outside
// them the emission interval does not fit the pacer's arithmetic
// (time.Duration spans 292 years) or is below what a pull consumer can feed.
const (
	MinLimit = 1.0 / 86400
	MaxLimit = 1e6
)

// Validate checks a loaded configuration against the rules of SPEC §3–§4
// and returns every problem at once: the error joins one [*FieldError] per
// problem ("<key path>: <what is wrong>", with the offending value), or is
// nil. Warnings (see [Warning]) are returned in both cases.
//
// Validate does not apply defaults: it expects a Config from [Load] (or one
// filled in completely by hand). It is safe to call again on a Config, for
// example by the daemon before applying a reloaded configuration.
func Validate(c *Config) ([]Warning, error) {
	p := newProblems()
	if c == nil {
		p.add("config", "missing")
		return nil, p.err()
	}
	w := validate(c, p)
	return w, p.err()
}

// validate adds the problems of c to p and returns the warnings.
func validate(c *Config, p *problems) []Warning {
	v := &validator{c: c, p: p}
	v.global()
	names := make([]string, 0, len(c.Downstreams))
	for name := range c.Downstreams {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) == 0 && !p.skip("downstreams") {
		p.add("downstreams", "at least one lane is required")
	}
	for _, name := range names {
		v.lane(name, c.Downstreams[name])
	}
	v.deadLetterStream()
	v.acrossLanes(names)
	return v.warns
}

type validator struct {
	c     *Config
	p     *problems
	warns []Warning
}

func (v *validator) warn(key, format string, args ...any) {
	v.warns = append(v.warns, Warning{Key: key, Message: fmt.Sprintf(format, args...)})
}

// check adds a problem with key unless key failed to load or ok holds.
func (v *validator) check(ok bool, key, format string, args ...any) {
	if ok || v.p.skip(key) {
		return
	}
	v.p.add(key, format, args...)
}

// show quotes the value of key for a message. A value expanded from ${ENV}
// is shown as its reference, and passwords in URLs are masked.
func (v *validator) show(key, value string) string {
	if tmpl, ok := v.c.templates[key]; ok {
		return strconv.Quote(tmpl) + " (expanded value not shown)"
	}
	return strconv.Quote(maskPassword(value))
}

func (v *validator) global() {
	c := v.c
	if c.NATS.URL != "" {
		v.natsURL("nats.url", c.NATS.URL)
	} else {
		v.check(c.NATS.Embedded.StoreDir != "", "nats.embedded.store_dir",
			"required when nats.url is empty (embedded server)")
	}
	v.listen("nats.embedded.listen", c.NATS.Embedded.Listen)
	v.natsSecurity()
	v.redis()
	v.listen("admin.listen", c.Admin.Listen)
	v.check(c.Admin.Token != "" || loopback(c.Admin.Listen), "admin.token",
		"required when admin.listen %q is not a loopback address: the admin API can pause and purge lanes", c.Admin.Listen)
	v.check(slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level), "log.level",
		"must be debug, info, warn or error, got %q", c.Log.Level)
	v.check(slices.Contains([]string{"text", "json"}, c.Log.Format), "log.format",
		"must be text or json, got %q", c.Log.Format)
	v.check(c.Shutdown.DrainTimeout > 0, "shutdown.drain_timeout", "must be > 0, got %s", c.Shutdown.DrainTimeout)
}

// natsSecurity checks nats.creds and nats.tls: only with nats.url (the
// embedded server takes neither), and every file as the start reads it
// (sources.Security.Check: readable, a creds file with its JWT and seed, a
// CA with a certificate, the certificate and key a pair), so that a config
// validate passes is not stopped at the start with exit 1.
func (v *validator) natsSecurity() {
	n := v.c.NATS
	sec := sources.Security{Creds: n.Creds, CAFile: n.TLS.CAFile, CertFile: n.TLS.CertFile, KeyFile: n.TLS.KeyFile}
	if n.URL == "" {
		for _, f := range []struct{ key, path string }{{"nats.creds", sec.Creds}, {"nats.tls.ca_file", sec.CAFile},
			{"nats.tls.cert_file", sec.CertFile}, {"nats.tls.key_file", sec.KeyFile}} {
			v.check(f.path == "", f.key, "only with nats.url (the embedded server needs no credentials nor TLS)")
		}
		return
	}
	// A file SecretsOptional let be (unreadFiles) is not read again; a
	// pair with one of them let be is not judged.
	if v.p.skip("nats.creds") {
		sec.Creds = ""
	}
	if v.p.skip("nats.tls.ca_file") {
		sec.CAFile = ""
	}
	if v.p.skip("nats.tls.cert_file") || v.p.skip("nats.tls.key_file") {
		sec.CertFile, sec.KeyFile = "", ""
	}
	for _, p := range sec.Check() {
		v.check(false, p.Key, "%s", p.Message)
	}
}

// natsURL checks a comma-separated list of NATS server URLs.
func (v *validator) natsURL(key, value string) {
	for _, s := range strings.Split(value, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil {
			v.check(false, key, "%s is not a valid URL", v.show(key, value))
			return
		}
		if !slices.Contains([]string{"nats", "tls", "ws", "wss"}, u.Scheme) {
			v.check(false, key, "%s: scheme must be nats, tls, ws or wss", v.show(key, value))
			return
		}
		if u.Host == "" {
			v.check(false, key, "%s has no host", v.show(key, value))
			return
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				v.check(false, key, "%s: port must be 1..65535", v.show(key, value))
				return
			}
		}
	}
}

// redis checks the redis section (docs/scaling.md).
func (v *validator) redis() {
	r := v.c.Redis
	if r.Addr != "" {
		for _, a := range strings.Split(r.Addr, ",") {
			v.redisAddr("redis.addr", strings.TrimSpace(a))
		}
	}
	v.check(r.ReplicasHint >= 1, "redis.replicas_hint", "must be ≥ 1, got %d", r.ReplicasHint)
	v.check(r.DB >= 0, "redis.db", "must be ≥ 0, got %d", r.DB)
	if r.DB > 0 && r.MasterName == "" && (r.Cluster || strings.Contains(r.Addr, ",")) {
		v.check(false, "redis.db", "must be 0 with a Redis Cluster (several addresses or redis.cluster true), got %d", r.DB)
	}
	if r.MasterName != "" { // Sentinel (docs/scaling.md)
		v.check(r.Addr != "", "redis.master_name", "needs redis.addr listing the sentinels (host:port of each)")
		v.check(!r.Cluster, "redis.master_name", "cannot be used with redis.cluster true: Sentinel and Redis Cluster exclude each other")
	}
	v.check(r.Timeout > 0, "redis.timeout", "must be > 0, got %s", r.Timeout)
	if r.Timeout > time.Second {
		v.warn("redis.timeout", "%s is long: a departure of a global lane waits up to this long for Redis before the lane falls back to local pacing", r.Timeout)
	}
	switch {
	case r.KeyPrefix == "":
		v.check(false, "redis.key_prefix", "must not be empty (default %q)", DefaultRedisKeyPrefix)
	case strings.ContainsAny(r.KeyPrefix, "{}") || strings.ContainsFunc(r.KeyPrefix, func(c rune) bool { return c <= ' ' || c == 0x7f }):
		v.check(false, "redis.key_prefix", "%q must not contain braces (keys carry a {hash tag}), spaces or control characters", r.KeyPrefix)
	}
	global := false
	for _, l := range v.c.Downstreams {
		global = global || l.Rate.Global
	}
	if global && r.ReplicasHint == 1 && r.Addr != "" {
		v.warn("redis.replicas_hint", "is 1 while lanes use rate.global: when Redis is unreachable every replica paces the full limit; set it to the number of replicas")
	}
}

// redisAddr checks host:port or a redis:// or rediss:// URL.
func (v *validator) redisAddr(key, value string) {
	if strings.Contains(value, "://") {
		u, err := url.Parse(value)
		switch {
		case err != nil:
			v.check(false, key, "%s is not a valid URL", v.show(key, value))
		case u.Scheme != "redis" && u.Scheme != "rediss":
			v.check(false, key, "%s: scheme must be redis or rediss (or give host:port)", v.show(key, value))
		case u.Host == "":
			v.check(false, key, "%s has no host", v.show(key, value))
		}
		return
	}
	if why := badHostPort(value); why != "" {
		v.check(false, key, "%s %s (e.g. 127.0.0.1:6379)", v.show(key, value), why)
	}
}

// listen checks a listen address host:port (port 0 = any free port).
func (v *validator) listen(key, value string) {
	if why := badHostPort(value); why != "" {
		v.check(false, key, "%q %s (e.g. 127.0.0.1:9464; port 0 = any free port)", value, why)
	}
}

// loopback reports whether the host of host:port s is a loopback address
// (127.0.0.0/8, ::1 or localhost); an empty host listens everywhere.
func loopback(s string) bool {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return true // reported by listen
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// badHostPort says why s is not host:port with a numeric port, or returns "".
func badHostPort(s string) string {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return "is not host:port"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "has a port that is not a number 0-65535"
	}
	return ""
}

// acrossLanes checks the rules between lanes: a subject belongs to one lane,
// a durable consumer to one lane, and dead letters are not consumed again.
func (v *validator) acrossLanes(names []string) {
	type owned struct {
		lane, subject string
		index         int
	}
	var seen []owned
	consumers := map[string]string{} // stream + "\x00" + consumer -> lane
	envNames := map[string]string{}  // SHAPER_DOWNSTREAMS_<LANE> -> lane
	for _, name := range names {
		l := v.c.Downstreams[name]
		prefix := "downstreams." + name + "."
		env := EnvName("downstreams." + name)
		if other, dup := envNames[env]; dup {
			v.check(false, "downstreams."+name, "lane name %q and lane %q share the environment variables %s_*", name, other, env)
		}
		envNames[env] = name
		for i, s := range l.Source.Subjects {
			if badSubject(s) != "" || v.p.skip(fmt.Sprintf("%ssource.subjects[%d]", prefix, i)) {
				continue
			}
			key := fmt.Sprintf("%ssource.subjects[%d]", prefix, i)
			for _, o := range seen {
				if o.lane == name {
					continue
				}
				if s == o.subject {
					v.check(false, key, "%q is also listed by lane %q (source.subjects[%d]): a subject belongs to one lane", s, o.lane, o.index)
					break
				}
				if subjectsOverlap(s, o.subject) {
					v.check(false, key, "%q overlaps %q of lane %q (source.subjects[%d]): a subject belongs to one lane", s, o.subject, o.lane, o.index)
					break
				}
			}
			seen = append(seen, owned{lane: name, subject: s, index: i})
		}
		if l.Source.Stream != "" && l.Source.Consumer != "" {
			id := l.Source.Stream + "\x00" + l.Source.Consumer
			if other, dup := consumers[id]; dup {
				v.check(false, prefix+"source.consumer", "%q is also the consumer of lane %q on stream %q", l.Source.Consumer, other, l.Source.Stream)
			} else {
				consumers[id] = name
			}
		}
	}
	for _, name := range names {
		dl := v.c.Downstreams[name].DeadLetter.Subject
		if badPublishSubject(dl) != "" {
			continue
		}
		for _, o := range seen {
			if subjectsOverlap(dl, o.subject) {
				v.check(false, "downstreams."+name+".dead_letter.subject",
					"%q is matched by source.subjects %q of lane %q: dead letters would be consumed again", dl, o.subject, o.lane)
				break
			}
		}
	}
}

// badName says why s is not a valid JetStream stream or consumer name, or
// returns "".
func badName(s string) string {
	if s == "" {
		return "empty"
	}
	for _, r := range s {
		switch {
		case r == '.' || r == '*' || r == '>' || r == '/' || r == '\\':
			return fmt.Sprintf("must not contain %q", r)
		case r <= ' ' || r == 0x7f:
			return "must not contain spaces or control characters"
		}
	}
	return ""
}

// badSubject says why s is not a valid NATS subject (wildcards allowed), or
// returns "".
func badSubject(s string) string {
	if s == "" {
		return "empty"
	}
	tokens := strings.Split(s, ".")
	for i, t := range tokens {
		switch {
		case t == "":
			return "empty token (leading, trailing or double '.')"
		case strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			return "must not contain spaces or control characters"
		case t == ">" && i != len(tokens)-1:
			return "'>' must be the last token"
		}
	}
	return ""
}

// badPublishSubject says why s is not a subject one can publish to.
func badPublishSubject(s string) string {
	if why := badSubject(s); why != "" {
		return why
	}
	for _, t := range strings.Split(s, ".") {
		if t == "*" || t == ">" {
			return "wildcards are not allowed here"
		}
	}
	return ""
}

// subjectsOverlap reports whether some subject matches both valid subject
// filters a and b.
func subjectsOverlap(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; ; i++ {
		if i == len(at) || i == len(bt) {
			return len(at) == len(bt)
		}
		x, y := at[i], bt[i]
		if x == ">" || y == ">" {
			return true
		}
		if x != "*" && y != "*" && x != y {
			return false
		}
	}
}
