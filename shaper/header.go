package shaper

import (
	"encoding/binary"
	"iter"
	"strings"
)

// Packed headers (issue 15: memory per queued message).
//
// A Go map of one entry costs about 400 heap bytes (a map header and a group
// of 8 slots), more than a 256-byte payload: a bucket of 100,000 messages
// with one header each spent ~40 MiB on the maps alone (heap profile,
// docs/performance.md). A source may therefore keep a message's
// headers packed into one string while it waits in the bucket (PackHeader);
// the lane unpacks them into Header when the message departs
// (UnpackHeader), so that sinks read Header as always — unless the sink
// reads them through the accessors only (drain.PackedHeaderReader: the
// map of every message is then never built). Before that, code
// reads headers through HeaderValue, HeaderValues and HeaderMap, which see
// Header when it is set and the packed form otherwise.
//
// The packed form is a sequence of (name, value) pairs, one per value, each
// string preceded by its length as a uvarint: unambiguous whatever bytes the
// names and values hold.

// PackHeader stores h in m in packed form and sets m.Header to nil. The
// strings of h are copied into one allocation, so h may be reused. An empty
// or nil h leaves m without headers.
//
// The map is walked once, into pairs on the stack (up to 8 without an
// allocation): starting a walk of a Go map is most of the cost of packing
// one header, and a second walk to size the string cost a message 1 % of
// the process's CPU at full speed (issue 15, throughput).
func (m *Message) PackHeader(h map[string][]string) {
	m.Header, m.packed = nil, ""
	var small [8][2]string
	pairs := small[:0]
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			pairs = append(pairs, [2]string{k, v})
			n += uvarintLen(len(k)) + len(k) + uvarintLen(len(v)) + len(v)
		}
	}
	if n == 0 {
		return
	}
	var b strings.Builder // one allocation of exactly n bytes; String does not copy
	b.Grow(n)
	var lb [binary.MaxVarintLen64]byte
	for _, kv := range pairs {
		b.Write(binary.AppendUvarint(lb[:0], uint64(len(kv[0]))))
		b.WriteString(kv[0])
		b.Write(binary.AppendUvarint(lb[:0], uint64(len(kv[1]))))
		b.WriteString(kv[1])
	}
	m.packed = b.String()
}

func uvarintLen(n int) int {
	w := 1
	for ; n >= 0x80; n >>= 7 {
		w++
	}
	return w
}

// UnpackHeader turns packed headers (PackHeader) into m.Header; it does
// nothing when there are none or m.Header is already set. The lane calls it
// when m departs, from the goroutine that owns m then: it writes m.Header
// and is not safe for concurrent use on the same message. The values share
// the packed string's memory (no copies).
func (m *Message) UnpackHeader() {
	if m.Header != nil || m.packed == "" {
		return
	}
	m.Header = unpack(m.packed)
	m.packed = ""
}

// HeaderMap returns m's headers as a map: m.Header when set, else a new map
// decoded from the packed form (nil when m has no headers). It writes
// nothing to m; the caller may keep the map but must not modify the slices
// of m.Header through it.
func (m *Message) HeaderMap() map[string][]string {
	if m.Header != nil || m.packed == "" {
		return m.Header
	}
	return unpack(m.packed)
}

// HeaderValue returns the first value of the header of that exact name and
// whether m has it (lookups are exact, as Message.Header). It allocates
// nothing.
func (m *Message) HeaderValue(name string) (string, bool) {
	if m.Header != nil || m.packed == "" {
		if v := m.Header[name]; len(v) > 0 {
			return v[0], true
		}
		return "", false
	}
	for p := m.packed; p != ""; {
		var k, v string
		k, v, p = nextPair(p)
		if k == name {
			return v, true
		}
	}
	return "", false
}

// HeaderPairs yields every (name, value) pair of m's headers, packed or
// not, a name once per value; the values of one name in their order, the
// names in no set order. It allocates nothing for packed headers (a sink
// that forwards headers reads them so, drain.PackedHeaderReader).
func (m *Message) HeaderPairs() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		if m.Header != nil || m.packed == "" {
			for k, vs := range m.Header {
				for _, v := range vs {
					if !yield(k, v) {
						return
					}
				}
			}
			return
		}
		for p := m.packed; p != ""; {
			var k, v string
			k, v, p = nextPair(p)
			if !yield(k, v) {
				return
			}
		}
	}
}

// HeaderFirst returns the first value of header name, of the exact key when
// m has it, else of a key equal to name ignoring case; "" when there is
// none. It allocates nothing.
func (m *Message) HeaderFirst(name string) string {
	if v, ok := m.HeaderValue(name); ok {
		return v
	}
	for k, v := range m.HeaderPairs() {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// HeaderValues returns every value of header name: of the exact key when m
// has it, else of the first key equal to name ignoring case (nil when none).
func (m *Message) HeaderValues(name string) []string {
	if m.Header != nil || m.packed == "" {
		return headerValues(m.Header, name)
	}
	var exact, folded []string
	foldKey := ""
	for p := m.packed; p != ""; {
		var k, v string
		k, v, p = nextPair(p)
		switch {
		case k == name:
			exact = append(exact, v)
		case exact == nil && (foldKey == "" && strings.EqualFold(k, name) || foldKey != "" && k == foldKey):
			foldKey = k
			folded = append(folded, v)
		}
	}
	if exact != nil {
		return exact
	}
	return folded
}

func unpack(p string) map[string][]string {
	h := make(map[string][]string, 1)
	for p != "" {
		var k, v string
		k, v, p = nextPair(p)
		h[k] = append(h[k], v)
	}
	return h
}

// nextPair reads one (name, value) pair of a packed header and returns the
// rest. The packed form is written by PackHeader only, so it is well formed.
func nextPair(p string) (k, v, rest string) {
	k, p = nextString(p)
	v, p = nextString(p)
	return k, v, p
}

func nextString(p string) (s, rest string) {
	n, w := uvarint(p)
	return p[w : w+int(n)], p[w+int(n):]
}

// uvarint is binary.Uvarint on a string (no conversion to []byte, which
// would allocate).
func uvarint(p string) (uint64, int) {
	var x uint64
	var s uint
	for i := 0; i < len(p); i++ {
		b := p[i]
		if b < 0x80 {
			return x | uint64(b)<<s, i + 1
		}
		x |= uint64(b&0x7f) << s
		s += 7
	}
	return 0, len(p)
}
