package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Load reads the configuration, applies the defaults of SPEC §4, expands
// ${ENV} references and validates the result (see [Validate]).
//
// Sources, lowest precedence first:
//  1. defaults;
//  2. the YAML file at path ("" means [DefaultPath]; an explicit path that
//     does not exist is an error, a missing default file only a warning);
//  3. environment variables SHAPER_<KEY PATH> (see [EnvPrefix]), bound for
//     every key outside the lanes and every key of every lane present in the
//     file, including keys the file leaves out; list values are
//     comma-separated ("1s,5s,30s"). A lane that is not in the file cannot
//     be created from the environment;
//  4. flags that were set on the command line, when flags is not nil, whose
//     name is a key path ("log.level", "downstreams.payments.rate.limit";
//     "-" and "_" are interchangeable, "." may also be written "-" or "_").
//     Other flags (such as --config) are ignored; a set flag that looks like
//     a lane key but matches none is ignored with a warning.
//
// Keys are case-insensitive (lane names and header names are lower-cased).
// Durations need a unit ("5s"; a bare number other than 0 is an error, never
// nanoseconds); rates are "N/s", "N/m", "N/h" or a number per second
// ([shaper.ParseLimit]). ${NAME} in nats.url, redis.addr, redis.username,
// redis.password, sink.url, sink.headers and sink.signing.secrets values is replaced by the
// environment variable NAME; one that is unset or empty is an error naming
// the key and the variable.
//
// On success Load returns the config and the warnings of [Validate]. When the
// configuration is invalid, the error joins (errors.Join) one [*FieldError]
// per problem — unknown keys, values that do not decode, failed rules — so
// err.Error() lists every problem on its own line as "<key path>: <what is
// wrong>"; the config is then nil, and the warnings found so far are still
// returned. Error messages never contain the value of an ${ENV} reference.
// A file that cannot be read or parsed returns a plain error.
//
// Options: [SecretsOptional].
func Load(path string, flags *pflag.FlagSet, opts ...LoadOption) (*Config, []Warning, error) {
	var lo loadOptions
	for _, o := range opts {
		o(&lo)
	}
	v := viper.New()
	path, raw, haveFile, warns, err := readFile(v, path)
	if err != nil {
		return nil, warns, err
	}

	p := newProblems()
	if haveFile {
		caseClashes(p, raw)
	}

	// The file alone: unknown keys and mappings where values belong (and the
	// reverse) are found here, before defaults and overrides are merged in.
	names, phantoms := laneNames(p, v)
	fileSettings := withoutLanes(v.AllSettings(), phantoms)
	checkShape(p, "", withEmptyKeys(fileSettings, raw), reflect.TypeFor[Config]())

	keys := setDefaults(v, names, fileSettings)
	origin, envWarns, err := bindEnv(v, keys, path, haveFile)
	warns = append(warns, envWarns...)
	if err != nil {
		return nil, warns, err
	}
	flagWarns, err := bindFlags(v, flags, keys, origin)
	warns = append(warns, flagWarns...)
	if err != nil {
		return nil, warns, err
	}

	settings := withoutLanes(v.AllSettings(), phantoms)
	c := decodeSettings(p, settings)
	warns = append(warns, expandSecrets(p, c, lo.secretsOptional)...)
	warns = append(warns, unexpandedRefs(c, settings)...)
	if lo.secretsOptional {
		warns = append(warns, unreadFiles(p, c)...)
	}
	fillDerived(c)
	warns = append(warns, validate(c, p)...)
	p.attribute(origin)
	if err := p.err(); err != nil {
		return nil, warns, err
	}
	return c, warns, nil
}

// LoadOption changes what Load asks of the file and the environment.
type LoadOption func(*loadOptions)

type loadOptions struct{ secretsOptional bool }

// SecretsOptional is for commands that read a lane's rules and reach no
// NATS server, Redis or downstream (shaper simulate): a ${NAME} reference
// whose variable is unset or empty is a warning that names the key and the
// variable, instead of a problem, and the rules on that key are skipped
// (its value keeps the ${NAME} text). So is a credentials, TLS or token
// file that cannot be read (nats.creds, nats.tls.*, sink.tls.*,
// sink.auth.path: a production config run on a laptop); the rules of
// that block are skipped. A malformed reference is still a problem. The
// daemon and shaper validate never use it: there an unset secret or an
// unreadable file is an error (rule 7).
func SecretsOptional() LoadOption { return func(o *loadOptions) { o.secretsOptional = true } }

// readFile reads the config file at path (DefaultPath when empty) into v
// and returns the path read and its bytes. A missing default file is a
// warning, not an error: then haveFile is false. The file is read once, so
// that a write in progress cannot give viper one version and the other
// checks another; an empty file (a truncate-then-write caught in between,
// C31) is an error that says so, never a configuration of defaults.
func readFile(v *viper.Viper, path string) (_ string, raw []byte, haveFile bool, warns []Warning, _ error) {
	explicit := path != ""
	if !explicit {
		path = DefaultPath
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		if !explicit && errors.Is(err, fs.ErrNotExist) {
			warns = append(warns, Warning{Key: "config", Message: fmt.Sprintf(
				"%s not found: using defaults, environment and flags only", path)})
			return path, nil, false, warns, nil
		}
		return path, nil, true, warns, fmt.Errorf("config: %w", err)
	}
	if Empty(raw) {
		return path, raw, true, warns, fmt.Errorf("config: %s is empty: it names no downstream (if it is being written, try again when the write is done)", path)
	}
	ext := strings.TrimPrefix(filepath.Ext(path), ".")
	if !slices.Contains(viper.SupportedExts, ext) {
		ext = "yaml"
	}
	v.SetConfigType(ext)
	if err := v.ReadConfig(bytes.NewReader(raw)); err != nil {
		if yerr := yamlSyntaxError(raw); yerr != nil { // the line of the problem (yamlerr.go)
			return path, raw, true, warns, fmt.Errorf("config: %s: %w", path, yerr)
		}
		return path, raw, true, warns, fmt.Errorf("config: read %s: %w", path, err)
	}
	return path, raw, true, warns, nil
}

// setDefaults sets the defaults of the top level and of each lane in v and
// returns every key a value can be given for: the struct's leaves, each
// lane's, and the sink headers the file names.
func setDefaults(v *viper.Viper, lanes []string, fileSettings map[string]any) []string {
	keys := leafKeys("", reflect.TypeFor[Config]())
	for k, val := range topDefaults() {
		v.SetDefault(k, val)
	}
	for _, lane := range lanes {
		prefix := "downstreams." + lane + "."
		for k, val := range laneDefaults() {
			v.SetDefault(prefix+k, val)
		}
		for _, k := range leafKeys("", reflect.TypeFor[Lane]()) {
			keys = append(keys, prefix+k)
		}
		for _, h := range headerNames(fileSettings, lane) {
			keys = append(keys, prefix+"sink.headers."+h)
		}
	}
	return keys
}

// bindEnv binds each key to its environment variable and returns the
// variable each overridden key came from, with a warning for each
// SHAPER_ variable that matches no key.
func bindEnv(v *viper.Viper, keys []string, path string, haveFile bool) (map[string]string, []Warning, error) {
	var warns []Warning
	known := make(map[string]bool, len(keys))
	origin := map[string]string{} // key → the variable or flag its value came from
	for _, k := range keys {
		if err := v.BindEnv(k, EnvName(k)); err != nil {
			return origin, warns, fmt.Errorf("config: bind %s: %w", k, err)
		}
		known[EnvName(k)] = true
		if val, ok := os.LookupEnv(EnvName(k)); ok && val != "" { // viper ignores empty ones
			origin[k] = EnvName(k)
		}
	}
	// A misspelt override, or one for a lane the file lacks, would silently
	// not apply: say so.
	if haveFile { // variables the file references as ${NAME} are secrets, not overrides
		if raw, err := os.ReadFile(path); err == nil {
			for _, m := range envRef.FindAllStringSubmatch(string(raw), -1) {
				known[m[1]] = true
			}
		}
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix+"_") && !known[name] {
			warns = append(warns, Warning{Key: name, Message: "environment variable matches no configuration key (misspelt, or a lane that is not in the file): ignored"})
		}
	}
	return origin, warns, nil
}

// bindFlags binds the flags set on the command line to their keys, records
// them in origin, and warns of a lane flag that matches no key.
func bindFlags(v *viper.Viper, flags *pflag.FlagSet, keys []string, origin map[string]string) ([]Warning, error) {
	if flags == nil {
		return nil, nil
	}
	var warns []Warning
	byEnv := make(map[string]string, len(keys))
	for _, k := range keys {
		byEnv[EnvName(k)] = k
	}
	var bindErr error
	flags.Visit(func(f *pflag.Flag) {
		k, ok := byEnv[EnvName(f.Name)]
		switch {
		case ok && bindErr == nil:
			bindErr = v.BindPFlag(k, f)
			origin[k] = "--" + f.Name
		case !ok && strings.HasPrefix(EnvName(f.Name), EnvName("downstreams")+"_"):
			warns = append(warns, Warning{Key: "--" + f.Name, Message: "flag matches no key of a lane in the file: ignored"})
		}
	})
	if bindErr != nil {
		return warns, fmt.Errorf("config: bind flags: %w", bindErr)
	}
	return warns, nil
}

// EnvName returns the environment variable that overrides key:
// "downstreams.eu-west.rate.limit" → "SHAPER_DOWNSTREAMS_EU_WEST_RATE_LIMIT".
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// laneNames returns the sorted names of the lanes in the file. It reads the
// raw file so that a lane with no keys at all ("payments:") is found too. A
// name with a dot cannot be told apart from a nested key by viper: it is
// reported and skipped, and the lane viper would make of the part before
// its first dot ("pay" of "pay.v2", with a key "v2") is returned in
// phantoms, unless the file names that lane too, so that it is not
// reported as well (a new-user pass found twenty problems of a lane "pay"
// under the one of "pay.v2").
func laneNames(p *problems, v *viper.Viper) (names []string, phantoms map[string]bool) {
	m, ok := v.Get("downstreams").(map[string]any)
	if !ok {
		return nil, nil
	}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if head, _, dotted := strings.Cut(name, "."); dotted {
			p.fail("downstreams."+name, fmt.Sprintf("lane name must match %s, got %q", laneNamePattern, name))
			if phantoms == nil {
				phantoms = map[string]bool{}
			}
			phantoms[strings.ToLower(head)] = true
			continue
		}
		names = append(names, name)
	}
	for _, name := range names {
		delete(phantoms, strings.ToLower(name))
	}
	return names, phantoms
}

// withoutLanes returns settings without the lanes named in drop (laneNames'
// phantoms). It changes settings' downstreams map in place.
func withoutLanes(settings map[string]any, drop map[string]bool) map[string]any {
	if ds, ok := settings["downstreams"].(map[string]any); ok {
		for name := range drop {
			delete(ds, name)
		}
	}
	return settings
}

// headerNames returns the header names the file gives for lane's sink.
func headerNames(settings map[string]any, lane string) []string {
	m := settings
	for _, k := range []string{"downstreams", lane, "sink", "headers"} {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return slices.Sorted(maps.Keys(m))
}

// leafKeys lists the key paths of the values of a struct type, recursively,
// by mapstructure tag. Maps (downstreams, sink.headers) are not leaves: their
// entries are only known from the file.
func leafKeys(prefix string, t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name := tagName(f)
		if name == "" {
			continue
		}
		key := joinKey(prefix, name)
		switch {
		case f.Type.Kind() == reflect.Map:
		case f.Type.Kind() == reflect.Struct:
			keys = append(keys, leafKeys(key, f.Type)...)
		default:
			keys = append(keys, key)
		}
	}
	return keys
}

// tagName returns the configuration key of a struct field, "" for fields
// that are not configuration (unexported or untagged).
func tagName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
	return name
}

func joinKey(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// caseClashes reports keys of one mapping that differ only in case
// ("Payments" and "payments"): viper folds keys to lower case, so one would
// silently replace the other.
func caseClashes(p *problems, raw []byte) {
	walkMappings(raw, func(n *yaml.Node, path []string) {
		seen := map[string]string{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			low := strings.ToLower(key)
			if prev, ok := seen[low]; ok && prev != key {
				p.add(strings.Join(append(slices.Clone(path), low), "."),
					"keys %q and %q differ only in case; keys are case-insensitive, so one would replace the other", prev, key)
			}
			seen[low] = key
		}
	})
}

// walkMappings parses raw as YAML and calls fn with each mapping of it and
// its key path (keys lower-cased, as viper reads them); nothing when raw
// does not parse (the reader reports syntax errors).
func walkMappings(raw []byte, fn func(n *yaml.Node, path []string)) {
	var root yaml.Node
	if len(raw) == 0 || yaml.Unmarshal(raw, &root) != nil {
		return
	}
	var walk func(n *yaml.Node, path []string)
	walk = func(n *yaml.Node, path []string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			fn(n, path)
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(n.Content[i+1], append(slices.Clone(path), strings.ToLower(n.Content[i].Value)))
			}
		}
	}
	walk(&root, nil)
}

// fillDerived sets the defaults that depend on the lane name, both for an
// absent key and for "" (SPEC §4 writes them as ""): source.consumer
// shaper-<lane> and dead_letter.subject shaper.dead.<lane>.
func fillDerived(c *Config) {
	for name, l := range c.Downstreams {
		if l.Source.Consumer == "" {
			l.Source.Consumer = DefaultConsumerPrefix + name
		}
		if l.DeadLetter.Subject == "" {
			l.DeadLetter.Subject = DefaultDeadLetterPrefix + name
		}
		c.Downstreams[name] = l
	}
}

// EffectiveMaxAckPending returns source.max_ack_pending, or when it is 0 the
// value derived from the bucket: capacity + max_in_flight with overflow
// block, 2 × capacity with overflow reject.
func (l Lane) EffectiveMaxAckPending() int {
	switch {
	case l.Source.MaxAckPending > 0:
		return l.Source.MaxAckPending
	case l.Bucket.Overflow == OverflowReject:
		return 2 * l.Bucket.Capacity
	default:
		return l.Bucket.Capacity + l.Task.MaxInFlight
	}
}

// Empty reports whether a config file's bytes hold nothing but white space:
// such a file is an error (a truncate-then-write caught in between, C31),
// never a configuration of defaults.
func Empty(raw []byte) bool { return len(bytes.TrimSpace(raw)) == 0 }

// withEmptyKeys returns a copy of settings with the keys of the file raw
// whose value is an empty mapping ({}) or null added back: viper's
// AllSettings leaves them out, so a misspelt section with nothing in it
// ("sinc: {}", "retyr:") passed the unknown-key check unseen. Keys are
// lower-cased and split at dots, as viper does.
func withEmptyKeys(settings map[string]any, raw []byte) map[string]any {
	out := cloneSettings(settings)
	walkMappings(raw, func(n *yaml.Node, path []string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			kp := strings.Split(strings.Join(append(slices.Clone(path), strings.ToLower(n.Content[i].Value)), "."), ".")
			switch val := n.Content[i+1]; {
			case val.Kind == yaml.MappingNode && len(val.Content) == 0:
				setMissing(out, kp, map[string]any{})
			case val.Kind == yaml.ScalarNode && val.Tag == "!!null":
				setMissing(out, kp, nil)
			}
		}
	})
	return out
}

// setMissing sets path in m to v unless it, or a value on the way to it
// that is not a mapping, is there already.
func setMissing(m map[string]any, path []string, v any) {
	for _, k := range path[:len(path)-1] {
		next, ok := m[k]
		if !ok {
			child := map[string]any{}
			m[k] = child
			m = child
			continue
		}
		if m, ok = next.(map[string]any); !ok {
			return
		}
	}
	if _, ok := m[path[len(path)-1]]; !ok {
		m[path[len(path)-1]] = v
	}
}

// cloneSettings copies the mappings of settings (the values are shared).
func cloneSettings(settings map[string]any) map[string]any {
	out := make(map[string]any, len(settings))
	for k, v := range settings {
		if m, ok := v.(map[string]any); ok {
			v = cloneSettings(m)
		}
		out[k] = v
	}
	return out
}
