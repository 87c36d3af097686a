//go:build linux

package sinks_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
)

// gateHold is how long the test's gate holds each request: far more than
// the way from Send to the wire, so that a request written before its
// gate returned reaches the downstream well before the gate's return.
const gateHold = 5 * time.Millisecond

// gatedSend sends m through s with a gate (shaper.WithGate) that holds the
// request gateHold and a wire report, and returns when the gate returned
// and how many times it was called.
func gatedSend(t *testing.T, s *sinks.HTTP, m *shaper.Message) (opened time.Time, calls int) {
	t.Helper()
	ctx := shaper.WithWire(context.Background(), func(time.Time, bool) {})
	ctx = shaper.WithGate(ctx, shaper.GateFunc(func() {
		calls++
		time.Sleep(gateHold)
		opened = time.Now()
	}))
	if err := s.Send(ctx, m); err != nil {
		t.Fatalf("send: %v", err)
	}
	return opened, calls
}

// TestHTTPGatesTheWrite: the HTTP sink on its own transport promises that
// no byte of a request is written before the gate of shaper.WithGate
// returned (drain.WireGater; the lane releases tasks a lead before their
// departure, drain/gate.go). Over plain HTTP/1.1 the task's goroutine waits
// at the gate and writes the request itself (direct.go); through the
// transport the gate is in the connection's Write. The downstream process's
// kernel stamp of each request (its first
// byte) is after the gate's return, on a new connection and on reused
// ones, and for a request that first waited for an OAuth2 token. Over
// HTTP/2 it is in GotConn, before the stream's headers: the
// handler runs after the gate's return. The gate is called once per
// request. Through a caller's client the sink makes no such promise.
func TestHTTPGatesTheWrite(t *testing.T) {
	// overHTTP1 sends 4 requests through a sink on cfg (its URL set to a
	// stamped downstream process's) and checks each kernel stamp.
	overHTTP1 := func(t *testing.T, cfg sinks.HTTPConfig, transport bool) {
		down := startStampedHTTPProcess(t)
		cfg.URL = down.URL()
		s := newHTTP(t, cfg)
		if transport {
			sinks.NoDirect(s)
		}
		if !s.GatesWire() {
			t.Fatal("GatesWire false on the sink's own transport")
		}
		opened := map[string]time.Time{}
		for i := range 4 { // the first on a new connection, then reused ones
			m := testMessage()
			m.StreamSeq = uint64(100 + i)
			at, calls := gatedSend(t, s, m)
			if calls != 1 {
				t.Fatalf("send %d: the gate was called %d times, want once", i, calls)
			}
			opened[m.Key()] = at
		}
		got, err := down.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(opened) {
			t.Fatalf("the downstream saw %d requests, want %d", len(got), len(opened))
		}
		for _, a := range got {
			at, ok := opened[a.key]
			if !ok {
				t.Fatalf("the downstream saw key %q, not sent", a.key)
			}
			if a.unstamped {
				t.Fatalf("request %s has no kernel stamp", a.key)
			}
			if a.at.Before(at) {
				t.Errorf("request %s reached the downstream %v before its gate returned", a.key, at.Sub(a.at))
			}
		}
	}
	// Plain HTTP/1.1 is written by the task's goroutine (direct.go);
	// through the transport (TLS, a proxy), the gate is in wireConn.Write.
	t.Run("HTTP/1.1", func(t *testing.T) { overHTTP1(t, sinks.HTTPConfig{}, false) })
	t.Run("HTTP/1.1 through the transport", func(t *testing.T) { overHTTP1(t, sinks.HTTPConfig{}, true) })
	// The first request waits for a token with no trace (the wire is
	// reported at once, so that the token does not hold the lane): the
	// gate must hold it all the same.
	t.Run("HTTP/1.1, waiting for an OAuth2 token", func(t *testing.T) {
		overHTTP1(t, sinks.HTTPConfig{Auth: oauthConfig(newTokenServer(t, time.Hour))}, false)
	})
	t.Run("HTTP/2", func(t *testing.T) {
		var mu sync.Mutex
		var seen []time.Time
		h2, ca := newH2Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, time.Now())
			mu.Unlock()
			if r.Proto != "HTTP/2.0" {
				t.Errorf("the server saw %s", r.Proto)
			}
		}))
		s := newHTTP(t, sinks.HTTPConfig{URL: h2.URL, TLS: sinks.TLSFiles{CAFile: ca}})
		if !s.GatesWire() {
			t.Fatal("GatesWire false on the sink's own transport")
		}
		for i := range 3 {
			at, calls := gatedSend(t, s, testMessage())
			if calls != 1 {
				t.Fatalf("send %d: the gate was called %d times, want once", i, calls)
			}
			mu.Lock()
			got := seen[len(seen)-1]
			mu.Unlock()
			if got.Before(at) {
				t.Errorf("send %d: the handler ran %v before the gate returned", i, at.Sub(got))
			}
		}
	})
	t.Run("a caller's client", func(t *testing.T) {
		s := newHTTP(t, sinks.HTTPConfig{URL: "http://127.0.0.1:1/", Client: &http.Client{}})
		if s.GatesWire() {
			t.Error("GatesWire true through a caller's client, which may write before any hook runs")
		}
	})
}
