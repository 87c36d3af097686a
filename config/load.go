package config

import (
	"errors"
	"fmt"
	"go.yaml.in/yaml/v3"
	"io/fs"
	"maps"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/shaper-dev/shaper/shaper"
)

// DefaultPath is the configuration file Load reads when its path is "".
const DefaultPath = "./config.yaml"

// EnvPrefix starts the name of every environment variable that overrides a
// key: SHAPER_<KEY PATH>, the path upper-cased with "." and "-" replaced by
// "_" (downstreams.eu-west.rate.limit is SHAPER_DOWNSTREAMS_EU_WEST_RATE_LIMIT).
const EnvPrefix = "SHAPER"

// Defaults of SPEC §4 for the keys outside the lanes.
const (
	DefaultEmbeddedListen   = "127.0.0.1:4222" // nats.embedded.listen
	DefaultEmbeddedStoreDir = "./data/nats"    // nats.embedded.store_dir
	DefaultAdminListen      = "127.0.0.1:9464" // admin.listen
	DefaultLogLevel         = "info"           // log.level
	DefaultLogFormat        = "text"           // log.format
	DefaultDrainTimeout     = 30 * time.Second // shutdown.drain_timeout
	DefaultReplicasHint     = 1                // redis.replicas_hint
)

// Defaults of the redis keys that SPEC §4 leaves to us (docs/scaling.md).
const (
	DefaultRedisKeyPrefix = "shaper"              // redis.key_prefix
	DefaultRedisTimeout   = 50 * time.Millisecond // redis.timeout
)

// Defaults of SPEC §4 for every lane. rate.limit, source.stream,
// source.subjects and sink.kind have none: they are required. Keys not
// listed default to zero (max_ack_pending, max_wait, max_age, slack,
// warmup.period, global).
const (
	DefaultAckWait     = 60 * time.Second         // source.ack_wait
	DefaultMaxDeliver  = 5                        // source.max_deliver
	DefaultCapacity    = 1000                     // bucket.capacity, messages
	DefaultOverflow    = OverflowBlock            // bucket.overflow
	DefaultColdFactor  = 3.0                      // rate.warmup.cold_factor
	DefaultMinSpacing  = shaper.DefaultMinSpacing // rate.min_spacing
	DefaultTaskTimeout = 5 * time.Second          // task.timeout
	DefaultMaxInFlight = 8                        // task.max_in_flight
	DefaultRetryAfter  = true                     // task.retry.retry_after
	DefaultMaxDelay    = 5 * time.Minute          // task.retry.max_delay
	DefaultSinkMethod  = "POST"                   // sink.method
	// DefaultConsumerPrefix + lane is the consumer of source.consumer "".
	DefaultConsumerPrefix = "shaper-"
	// DefaultDeadLetterPrefix + lane is the subject of dead_letter.subject "".
	DefaultDeadLetterPrefix = "shaper.dead."
)

// DefaultBackoff returns the default task.retry.backoff: 1s, 5s, 30s (a new
// slice on every call).
func DefaultBackoff() []time.Duration {
	return []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
}

// DefaultSuccessStatus returns the default sink.success_status: ["2xx"].
func DefaultSuccessStatus() []string { return []string{"2xx"} }

// laneDefaults is the table of per-lane defaults, by key path relative to
// the lane. Load registers them for every lane found in the file, so viper's
// own precedence decides between an absent key (default) and an explicit one
// (even an invalid zero such as capacity: 0, which Validate then rejects).
func laneDefaults() map[string]any {
	return map[string]any{
		"source.ack_wait":          DefaultAckWait,
		"source.max_deliver":       DefaultMaxDeliver,
		"source.max_ack_pending":   0,
		"source.max_message_bytes": 0,
		"bucket.capacity":          DefaultCapacity,
		"bucket.overflow":          DefaultOverflow,
		"bucket.max_wait":          time.Duration(0),
		"bucket.max_age":           time.Duration(0),
		"rate.slack":               0,
		"rate.min_spacing":         DefaultMinSpacing,
		"rate.warmup.period":       time.Duration(0),
		"rate.warmup.cold_factor":  DefaultColdFactor,
		"rate.global":              false,
		"task.timeout":             DefaultTaskTimeout,
		"task.max_in_flight":       DefaultMaxInFlight,
		"task.retry.backoff":       DefaultBackoff(),
		"task.retry.retry_after":   DefaultRetryAfter,
		"task.retry.max_delay":     DefaultMaxDelay,
		"sink.method":              DefaultSinkMethod,
		"sink.success_status":      DefaultSuccessStatus(),
	}
}

// topDefaults is the table of defaults outside the lanes.
func topDefaults() map[string]any {
	return map[string]any{
		"nats.embedded.listen":    DefaultEmbeddedListen,
		"nats.embedded.store_dir": DefaultEmbeddedStoreDir,
		"admin.listen":            DefaultAdminListen,
		"log.level":               DefaultLogLevel,
		"log.format":              DefaultLogFormat,
		"shutdown.drain_timeout":  DefaultDrainTimeout,
		"redis.replicas_hint":     DefaultReplicasHint,
		"redis.key_prefix":        DefaultRedisKeyPrefix,
		"redis.timeout":           DefaultRedisTimeout,
	}
}

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
// redis.password, sink.url and sink.headers values is replaced by the
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
func Load(path string, flags *pflag.FlagSet) (*Config, []Warning, error) {
	var warns []Warning
	v := viper.New()

	explicit := path != ""
	if !explicit {
		path = DefaultPath
	}
	haveFile := true
	if _, err := os.Stat(path); err != nil {
		if !explicit && errors.Is(err, fs.ErrNotExist) {
			haveFile = false
			warns = append(warns, Warning{Key: "config", Message: fmt.Sprintf(
				"%s not found: using defaults, environment and flags only", path)})
		} else {
			return nil, warns, fmt.Errorf("config: %w", err)
		}
	}
	if haveFile {
		v.SetConfigFile(path)
		if ext := strings.TrimPrefix(filepath.Ext(path), "."); !slices.Contains(viper.SupportedExts, ext) {
			v.SetConfigType("yaml")
		}
		if err := v.ReadInConfig(); err != nil {
			return nil, warns, fmt.Errorf("config: read %s: %w", path, err)
		}
	}

	p := newProblems()
	if haveFile {
		if raw, err := os.ReadFile(path); err == nil {
			caseClashes(p, raw)
		}
	}

	// The file alone: unknown keys and mappings where values belong (and the
	// reverse) are found here, before defaults and overrides are merged in.
	fileSettings := v.AllSettings()
	checkShape(p, "", fileSettings, reflect.TypeFor[Config]())

	lanes := laneNames(p, v)
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
	known := make(map[string]bool, len(keys))
	for _, k := range keys {
		if err := v.BindEnv(k, EnvName(k)); err != nil {
			return nil, warns, fmt.Errorf("config: bind %s: %w", k, err)
		}
		known[EnvName(k)] = true
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
	if flags != nil {
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
			case !ok && strings.HasPrefix(EnvName(f.Name), EnvName("downstreams")+"_"):
				warns = append(warns, Warning{Key: "--" + f.Name, Message: "flag matches no key of a lane in the file: ignored"})
			}
		})
		if bindErr != nil {
			return nil, warns, fmt.Errorf("config: bind flags: %w", bindErr)
		}
	}

	c := decodeSettings(p, v.AllSettings())
	expandSecrets(p, c)
	fillDerived(c)
	warns = append(warns, validate(c, p)...)
	if err := p.err(); err != nil {
		return nil, warns, err
	}
	return c, warns, nil
}

// EnvName returns the environment variable that overrides key:
// "downstreams.eu-west.rate.limit" → "SHAPER_DOWNSTREAMS_EU_WEST_RATE_LIMIT".
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// laneNames returns the sorted names of the lanes in the file. It reads the
// raw file so that a lane with no keys at all ("payments:") is found too. A
// name with a dot cannot be told apart from a nested key by viper: it is
// reported and skipped.
func laneNames(p *problems, v *viper.Viper) []string {
	m, ok := v.Get("downstreams").(map[string]any)
	if !ok {
		return nil
	}
	var names []string
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if strings.Contains(name, ".") {
			p.fail("downstreams."+name, fmt.Sprintf("lane name must match %s, got %q", laneNamePattern, name))
			continue
		}
		names = append(names, name)
	}
	return names
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

// checkShape walks raw settings along the type they decode into and reports
// unknown keys and mappings given where the type has no mapping. Scalars
// given where a mapping belongs are reported here too, although the decoder
// finds them as well (with the same message, so they are listed once): an
// override of a key below such a scalar would otherwise hide it.
func checkShape(p *problems, prefix string, raw any, t reflect.Type) {
	m, ok := raw.(map[string]any)
	if !ok {
		if raw != nil && (t.Kind() == reflect.Struct || t.Kind() == reflect.Map) {
			p.fail(prefix, "expected "+describeType(t)+", got "+describeValue(raw))
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			if name := tagName(t.Field(i)); name != "" {
				fields[name] = t.Field(i).Type
			}
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			key := joinKey(prefix, k)
			ft, ok := fields[k]
			if !ok {
				p.fail(key, "unknown key")
				continue
			}
			checkShape(p, key, m[k], ft)
		}
	case reflect.Map:
		for _, k := range slices.Sorted(maps.Keys(m)) {
			checkShape(p, joinKey(prefix, k), m[k], t.Elem())
		}
	default:
		p.fail(prefix, "expected "+describeType(t)+", got a mapping")
	}
}

// decodeSettings decodes merged settings into a Config. Each lane is decoded
// on its own so that a lane with a bad value is still kept (partially
// decoded) and validated: every problem is listed, not just the first.
func decodeSettings(p *problems, settings map[string]any) *Config {
	c := &Config{Downstreams: map[string]Lane{}}
	top := maps.Clone(settings)
	delete(top, "downstreams")
	decodeInto(p, "", top, c)
	switch lanes := settings["downstreams"].(type) {
	case nil:
	case map[string]any:
		for name, raw := range lanes {
			var l Lane
			decodeInto(p, "downstreams."+name, raw, &l)
			c.Downstreams[name] = l
		}
	default:
		p.fail("downstreams", "expected "+describeType(reflect.TypeFor[map[string]Lane]())+", got "+describeValue(lanes))
	}
	return c
}

// decodeInto decodes raw into out with mapstructure and [decodeHook], and
// reports each error under its full key path (prefix + the field's path).
func decodeInto(p *problems, prefix string, raw, out any) {
	d, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook: mapstructure.DecodeHookFuncValue(decodeHook),
		Result:     out,
		TagName:    "mapstructure",
	})
	if err != nil {
		p.fail(prefix, err.Error())
		return
	}
	if err := d.Decode(raw); err != nil {
		reportDecodeError(p, prefix, err)
	}
}

// reportDecodeError flattens the (wrapped, joined) mapstructure errors into
// problems, one per field.
func reportDecodeError(p *problems, prefix string, err error) {
	switch e := err.(type) {
	case *mapstructure.DecodeError:
		msg := e.Error()
		if inner := e.Unwrap(); inner != nil {
			msg = inner.Error()
		}
		p.fail(joinKey(prefix, keyFromDecoderName(e.Name())), msg)
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			reportDecodeError(p, prefix, inner)
		}
	case interface{ Unwrap() error }:
		if inner := e.Unwrap(); inner != nil {
			reportDecodeError(p, prefix, inner)
			return
		}
		p.fail(prefix, err.Error())
	default:
		p.fail(prefix, err.Error())
	}
}

// keyFromDecoderName turns mapstructure's field names into key paths: map
// entries "sink.headers[x-token]" become "sink.headers.x-token"; list
// indexes "task.retry.backoff[0]" stay as they are.
func keyFromDecoderName(name string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(name, '[')
		if i < 0 {
			b.WriteString(name)
			return b.String()
		}
		j := strings.IndexByte(name[i:], ']')
		if j < 0 {
			b.WriteString(name)
			return b.String()
		}
		j += i
		b.WriteString(name[:i])
		if inner := name[i+1 : j]; isDigits(inner) {
			b.WriteString(name[i : j+1])
		} else {
			b.WriteString("." + inner)
		}
		name = name[j+1:]
	}
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	limitType    = reflect.TypeFor[shaper.Limit]()
)

// decodeHook converts every raw value (from YAML, the environment, flags or
// defaults) into the type of its field, strictly: no silent truncation,
// no "5" meaning 5 ns, no boolean from a number. Its errors describe the
// value; the decoder adds the key.
func decodeHook(from, to reflect.Value) (any, error) {
	data := from.Interface()
	t := to.Type()
	switch t {
	case durationType:
		return toDuration(data)
	case limitType:
		return toLimit(data)
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		if from.Kind() != reflect.Map {
			return nil, errors.New("expected " + describeType(t) + ", got " + describeValue(data))
		}
	case reflect.Slice:
		if s, ok := data.(string); ok {
			return splitList(s), nil
		}
		if from.Kind() != reflect.Slice {
			return nil, errors.New("expected a list, got " + describeValue(data))
		}
	case reflect.String:
		return toString(data)
	case reflect.Int:
		return toInt(data)
	case reflect.Bool:
		return toBool(data)
	case reflect.Float64:
		return toFloat(data)
	}
	return data, nil
}

// splitList splits an environment or flag value "a, b" (optionally in
// brackets) into its items.
func splitList(s string) []string {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if strings.TrimSpace(s) == "" {
		return []string{}
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// caseClashes reports keys of one mapping that differ only in case
// ("Payments" and "payments"): viper folds keys to lower case, so one would
// silently replace the other.
func caseClashes(p *problems, raw []byte) {
	var root yaml.Node
	if yaml.Unmarshal(raw, &root) != nil {
		return // the reader reports syntax errors
	}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			seen := map[string]string{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				key := n.Content[i].Value
				low := strings.ToLower(key)
				kp := low
				if path != "" {
					kp = path + "." + low
				}
				if prev, ok := seen[low]; ok && prev != key {
					p.add(kp, "keys %q and %q differ only in case; keys are case-insensitive, so one would replace the other", prev, key)
				}
				seen[low] = key
				walk(n.Content[i+1], kp)
			}
		}
	}
	walk(&root, "")
}

// envRef finds ${NAME} references in the raw file.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// durationHint is the example that duration errors give.
const durationHint = "(e.g. 5s, 250ms, 1m30s)"

func toDuration(data any) (any, error) {
	switch d := data.(type) {
	case time.Duration:
		return d, nil
	case string:
		s := strings.TrimSpace(d)
		if s == "0" {
			return time.Duration(0), nil
		}
		if _, err := strconv.ParseFloat(s, 64); err == nil {
			return nil, fmt.Errorf("%q is not a duration with a unit (e.g. 5s)", d)
		}
		dur, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration %s", d, durationHint)
		}
		return dur, nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		if reflect.ValueOf(d).IsZero() {
			return time.Duration(0), nil
		}
		return nil, fmt.Errorf("%q is not a duration with a unit (e.g. 5s)", fmt.Sprint(d))
	default:
		return nil, errors.New("expected a duration " + durationHint + ", got " + describeValue(data))
	}
}

func toLimit(data any) (any, error) {
	var s string
	switch d := data.(type) {
	case shaper.Limit:
		return d, nil
	case string:
		s = d
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		s = fmt.Sprint(d)
	default:
		return nil, errors.New("expected a rate (N/s, N/m, N/h or a number per second), got " + describeValue(data))
	}
	l, err := shaper.ParseLimit(s)
	if err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "shaper: "))
	}
	return l, nil
}

func toString(data any) (any, error) {
	switch d := data.(type) {
	case string:
		return d, nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(d), nil
	case float32, float64:
		return fmt.Sprint(d), nil
	default:
		return nil, errors.New("expected a string, got " + describeValue(data))
	}
}

func toInt(data any) (any, error) {
	switch d := data.(type) {
	case int:
		return d, nil
	case int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		n, err := strconv.ParseInt(fmt.Sprint(d), 10, 0)
		if err != nil {
			return nil, fmt.Errorf("%v is out of range", d)
		}
		return int(n), nil
	case float32, float64:
		f := reflect.ValueOf(d).Float()
		if f != math.Trunc(f) {
			return nil, fmt.Errorf("%v is not an integer", d)
		}
		if math.Abs(f) > math.MaxInt32 {
			return nil, fmt.Errorf("%v is out of range", d)
		}
		return int(f), nil
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(d))
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", d)
		}
		return n, nil
	default:
		return nil, errors.New("expected an integer, got " + describeValue(data))
	}
}

func toBool(data any) (any, error) {
	switch d := data.(type) {
	case bool:
		return d, nil
	case string:
		switch strings.ToLower(strings.TrimSpace(d)) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return nil, fmt.Errorf("%q is not true or false", d)
	default:
		return nil, errors.New("expected true or false, got " + describeValue(data))
	}
}

func toFloat(data any) (any, error) {
	switch d := data.(type) {
	case float64:
		return d, nil
	case float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		f, _ := strconv.ParseFloat(fmt.Sprint(d), 64)
		return f, nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(d), 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", d)
		}
		return f, nil
	default:
		return nil, errors.New("expected a number, got " + describeValue(data))
	}
}

// describeValue names a raw value for an error message: strings quoted,
// numbers and booleans as written, lists and mappings by kind.
func describeValue(v any) string {
	switch d := v.(type) {
	case nil:
		return "nothing"
	case string:
		return strconv.Quote(d)
	case bool:
		return "boolean " + strconv.FormatBool(d)
	}
	switch reflect.ValueOf(v).Kind() {
	case reflect.Map:
		return "a mapping"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	return fmt.Sprint(v)
}

// describeType names the expected type of a key for an error message.
func describeType(t reflect.Type) string {
	switch t {
	case durationType:
		return "a duration " + durationHint
	case reflect.TypeFor[map[string]Lane]():
		return "a mapping of lane name to lane"
	case limitType:
		return "a rate (N/s, N/m, N/h or a number per second)"
	}
	switch t.Kind() {
	case reflect.Struct:
		return "a mapping of keys"
	case reflect.Map:
		return "a mapping"
	case reflect.Slice:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Int:
		return "an integer"
	case reflect.Bool:
		return "true or false"
	case reflect.Float64:
		return "a number"
	}
	return t.String()
}

// expandSecrets replaces ${NAME} references by the environment in the keys
// that may hold secrets, and remembers the original text so messages and
// Redacted never show the expanded value.
func expandSecrets(p *problems, c *Config) {
	c.templates = map[string]string{}
	expand := func(key string, s *string) {
		out, changed, err := expandEnv(*s)
		if err != nil {
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
		c.Downstreams[name] = l
	}
}

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
		return s, true, fmt.Errorf("environment variable referenced by %s is not set (or empty)", strings.Join(refs, ", "))
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
	r.Downstreams = make(map[string]Lane, len(c.Downstreams))
	for name, l := range c.Downstreams {
		prefix := "downstreams." + name + ".sink."
		l.Source.Subjects = slices.Clone(l.Source.Subjects)
		l.Task.Retry.Backoff = slices.Clone(l.Task.Retry.Backoff)
		l.Sink.SuccessStatus = slices.Clone(l.Sink.SuccessStatus)
		l.Sink.RetryableStatus = slices.Clone(l.Sink.RetryableStatus)
		l.Sink.URL = c.shownRaw(prefix+"url", l.Sink.URL)
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

// maskPassword masks the password of every URL in a comma-separated list.
func maskPassword(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	parts := strings.Split(s, ",")
	for i, part := range parts {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil {
			if strings.Contains(part, "@") {
				parts[i] = redactedValue
			}
			continue
		}
		if u.User != nil {
			// A user name alone may be a token (https://TOKEN@host): mask it too.
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				u.User = url.User("xxxxx")
			}
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
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
