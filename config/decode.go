package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"

	"github.com/shaper-dev/shaper/shaper"
)

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
	optLimitType = reflect.TypeFor[OptionalLimit]()
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
	case optLimitType:
		return toOptionalLimit(data)
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
	case optLimitType:
		return `a rate (N/s, N/m, N/h or a number per second) or "" (off)`
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
