package sinks_test

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
)

// TestHTTPWireReportExact: the HTTP sink reports a request's wire instant
// as exact (shaper.WithWire) only when that instant cannot come before the
// downstream's stamp of its arrival: the request was written whole, on an
// HTTP/1.1 connection of the sink's own, to a loopback peer. Over HTTP/2
// another stream's write or a frame may report it, and through a caller's
// client the report is WroteRequest's (the request in the buffer), so
// those are not exact: there the pacer keeps a tenth of an interval back
// (Pacer.Wire).
func TestHTTPWireReportExact(t *testing.T) {
	var mu sync.Mutex
	proto := ""
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		proto = r.Proto
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	h1 := newServer(t, h)
	h2, ca := newH2Server(t, h)

	type row struct {
		name      string
		cfg       sinks.HTTPConfig
		wantProto string
		exact     bool
	}
	rows := []row{
		{"HTTP/1.1 to loopback", sinks.HTTPConfig{URL: h1.URL}, "HTTP/1.1", true},
		{"HTTP/2 to loopback", sinks.HTTPConfig{URL: h2.URL, TLS: sinks.TLSFiles{CAFile: ca}}, "HTTP/2.0", false},
		{"a caller's client", sinks.HTTPConfig{URL: h1.URL, Client: &http.Client{}}, "HTTP/1.1", false},
	}
	// A peer at one of this host's own addresses that is not loopback: the
	// sink cannot know that no network lies between.
	if ip := nonLoopbackIPv4(t); ip != nil {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		if err != nil {
			t.Fatal(err)
		}
		other := httptest.NewUnstartedServer(h)
		other.Listener = ln
		other.Start()
		t.Cleanup(other.Close)
		rows = append(rows, row{"HTTP/1.1 to " + ip.String(), sinks.HTTPConfig{URL: other.URL}, "HTTP/1.1", false})
	} else {
		t.Log("no IPv4 address but loopback: the row for a peer that is not loopback is left out")
	}
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			s := newHTTP(t, tc.cfg)
			for i := range 3 { // the first on a new connection, then reused ones
				reports := make(chan bool, 4)
				ctx := shaper.WithWire(context.Background(), func(_ time.Time, exact bool) { reports <- exact })
				m := testMessage()
				m.StreamSeq = uint64(i + 1)
				if err := s.Send(ctx, m); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
				mu.Lock()
				got := proto
				mu.Unlock()
				if got != tc.wantProto {
					t.Fatalf("the server saw %s, want %s", got, tc.wantProto)
				}
				// HTTP/2 writes the request on a goroutine of its own, which
				// may report after the response came.
				select {
				case exact := <-reports:
					if exact != tc.exact {
						t.Errorf("send %d: wire report with exact %v, want %v", i, exact, tc.exact)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("send %d: no wire report", i)
				}
				if len(reports) > 0 {
					t.Errorf("send %d: %d more wire reports, want one", i, len(reports))
				}
			}
		})
	}
}

// newH2Server starts an HTTP/2 server over TLS on loopback, closed by
// t.Cleanup, and returns it with the path of a PEM file of its certificate
// (sink.tls.ca_file).
func newH2Server(t *testing.T, h http.Handler) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, ca
}

// nonLoopbackIPv4 returns an IPv4 address of this host that is not
// loopback, or nil.
func nonLoopbackIPv4(t *testing.T) net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP
		}
	}
	return nil
}
