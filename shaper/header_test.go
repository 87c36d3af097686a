package shaper

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPackedHeader: headers packed by PackHeader read the same through
// every accessor as the map they came from, HeaderMap and UnpackHeader give
// the map back (values in order, odd bytes included), and Key, the fair key
// and TimingOfMessage see packed headers as they see Header.
func TestPackedHeader(t *testing.T) {
	h := map[string][]string{
		MsgIDHeader:       {"job-7"},
		"Multi":           {"a", "", "c"},
		"odd":             {"x:y\x00z\r\n" + strings.Repeat("é", 100)}, // > 127 bytes: a 2-byte length
		"Shaper-Deadline": {"1700000000"},
		"":                {"empty name"},
	}
	var m Message
	m.PackHeader(h)
	if m.Header != nil {
		t.Fatal("PackHeader left Header set")
	}
	for k, vs := range h {
		if v, ok := m.HeaderValue(k); !ok || v != vs[0] {
			t.Errorf("HeaderValue(%q) = %q, %v; want %q", k, v, ok, vs[0])
		}
		if got := m.HeaderValues(k); !slices.Equal(got, vs) {
			t.Errorf("HeaderValues(%q) = %q, want %q", k, got, vs)
		}
	}
	if _, ok := m.HeaderValue("absent"); ok {
		t.Error("HeaderValue found an absent header")
	}
	if got := m.HeaderValues("MULTI"); !slices.Equal(got, h["Multi"]) {
		t.Errorf("HeaderValues ignoring case = %q, want %q", got, h["Multi"])
	}
	if got := m.HeaderMap(); !maps.EqualFunc(got, h, slices.Equal) {
		t.Errorf("HeaderMap = %q, want %q", got, h)
	}
	if m.Header != nil {
		t.Error("HeaderMap wrote Header")
	}
	if got := m.Key(); got != "job-7" {
		t.Errorf("Key = %q, want the packed Nats-Msg-Id", got)
	}
	key, err := FairKeyFunc("Multi")
	if err != nil {
		t.Fatal(err)
	}
	if got := key(&m); got != "a" {
		t.Errorf("fair key = %q, want a", got)
	}
	tm, err := TimingOfMessage(&m)
	if err != nil || !tm.Deadline.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("TimingOfMessage = %v, %v; want the packed deadline", tm, err)
	}
	m.UnpackHeader()
	if !maps.EqualFunc(m.Header, h, slices.Equal) {
		t.Errorf("UnpackHeader: Header = %q, want %q", m.Header, h)
	}
	if m.packed != "" {
		t.Error("UnpackHeader kept the packed form")
	}
	if v, ok := m.HeaderValue("Multi"); !ok || v != "a" {
		t.Errorf("after UnpackHeader, HeaderValue = %q, %v", v, ok)
	}

	// No headers: nothing packed, nothing unpacked, Key falls back.
	var e Message
	e.Stream, e.StreamSeq = "S", 3
	e.PackHeader(nil)
	e.PackHeader(map[string][]string{"k": nil})
	e.UnpackHeader()
	if e.Header != nil || e.HeaderMap() != nil || e.Key() != "S:3" {
		t.Errorf("empty headers: Header %v, HeaderMap %v, Key %q", e.Header, e.HeaderMap(), e.Key())
	}
	// A replayed message keeps its original key, packed or not.
	var r Message
	r.PackHeader(map[string][]string{ReplayOfHeader: {"9"}, KeyHeader: {"orig"}, MsgIDHeader: {"new"}})
	if got := r.Key(); got != "orig" {
		t.Errorf("replayed packed Key = %q, want orig", got)
	}
}

// TestPackedHeaderSize: the packed form of one Nats-Msg-Id is one
// allocation of its bytes and two lengths, not a map (~400 bytes).
func TestPackedHeaderSize(t *testing.T) {
	h := map[string][]string{MsgIDHeader: {"job-12345"}}
	var m Message
	allocs := testing.AllocsPerRun(100, func() { m.PackHeader(h) })
	if allocs != 1 {
		t.Errorf("PackHeader: %v allocations, want 1", allocs)
	}
	if want := 1 + len(MsgIDHeader) + 1 + len("job-12345"); len(m.packed) != want {
		t.Errorf("packed form of %d bytes, want %d", len(m.packed), want)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = m.HeaderValue(MsgIDHeader) }); allocs != 0 {
		t.Errorf("HeaderValue: %v allocations, want 0", allocs)
	}
	// The lane reads the timing headers of every admitted message.
	if allocs := testing.AllocsPerRun(100, func() { _, _ = TimingOfMessage(&m) }); allocs != 0 {
		t.Errorf("TimingOfMessage without timing headers: %v allocations, want 0", allocs)
	}
}

// TestPackHeaderManyPairs: more pairs than PackHeader's stack array holds
// (8) pack and unpack to the same headers.
func TestPackHeaderManyPairs(t *testing.T) {
	h := map[string][]string{}
	for i := range 10 {
		h[fmt.Sprintf("X-Key-%d", i)] = []string{fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)}
	}
	var m Message
	m.PackHeader(h)
	m.UnpackHeader()
	if !reflect.DeepEqual(map[string][]string(m.Header), h) {
		t.Errorf("20 pairs: unpacked %v, want %v", m.Header, h)
	}
}
