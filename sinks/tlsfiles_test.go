package sinks_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/sinks"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf signed by ca with the given serial, for a server
// (ips as its names) or a client (no ips), as PEM certificate and key.
func (ca *testCA) issue(t *testing.T, serial int64, ips ...net.IP) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if len(ips) > 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// mtlsServer is an HTTPS server that requires a client certificate of
// clientCA and records the serials of the client certificates it saw, one
// per connection and per request.
type mtlsServer struct {
	srv      *httptest.Server
	mu       sync.Mutex
	requests []int64 // client certificate serial of each request
}

func newMTLSServer(t *testing.T, serverCA, clientCA *testCA, ips ...net.IP) *mtlsServer {
	t.Helper()
	if len(ips) == 0 {
		ips = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	certPEM, keyPEM := serverCA.issue(t, 100, ips...)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(clientCA.cert)
	m := &mtlsServer{}
	m.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.requests = append(m.requests, r.TLS.PeerCertificates[0].SerialNumber.Int64())
		m.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	m.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point of some tests
	m.srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	m.srv.StartTLS()
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mtlsServer) last() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.requests) == 0 {
		return 0
	}
	return m.requests[len(m.requests)-1]
}

// tlsDir writes the CA bundle and a client pair into a fresh directory.
func tlsDir(t *testing.T, ca []byte, cert, key []byte) sinks.TLSFiles {
	t.Helper()
	dir := t.TempDir()
	f := sinks.TLSFiles{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "client.pem"), KeyFile: filepath.Join(dir, "client-key.pem")}
	writeRename(t, f.CAFile, string(ca))
	writeRename(t, f.CertFile, string(cert))
	writeRename(t, f.KeyFile, string(key))
	return f
}

// TestTLSClientCertificateRotation: against a server that requires client
// certificates of a private CA, the sink presents tls.cert_file and trusts
// tls.ca_file; a new certificate written over the old one during the run
// is used by the next connections, with no restart.
func TestTLSClientCertificateRotation(t *testing.T) {
	ca := newTestCA(t, "private root")
	srv := newMTLSServer(t, ca, ca)
	c1, k1 := ca.issue(t, 1001)
	files := tlsDir(t, ca.pem, c1, k1)
	s := newHTTP(t, sinks.HTTPConfig{URL: srv.srv.URL, TLS: files})
	for range 5 {
		if err := send(t, s, testMessage()); err != nil {
			t.Fatalf("send over mTLS: %v", err)
		}
	}
	if got := srv.last(); got != 1001 {
		t.Fatalf("server saw client certificate %d, want 1001", got)
	}

	c2, k2 := ca.issue(t, 1002)
	writeRename(t, files.KeyFile, string(k2))
	writeRename(t, files.CertFile, string(c2))
	deadline := time.Now().Add(3 * time.Second)
	for srv.last() != 1002 {
		if time.Now().After(deadline) {
			t.Fatalf("3s after the rotation the server still sees client certificate %d; want 1002", srv.last())
		}
		if err := send(t, s, testMessage()); err != nil {
			t.Fatalf("send during the rotation: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 5 {
		if err := send(t, s, testMessage()); err != nil {
			t.Fatal(err)
		}
		if got := srv.last(); got != 1002 {
			t.Errorf("after the rotation a request came with certificate %d, want 1002", got)
		}
	}
}

// TestTLSVerifiesServer: tls.ca_file is the only root: a server certificate
// of another CA, or of the right CA for another address, is refused.
func TestTLSVerifiesServer(t *testing.T) {
	ca := newTestCA(t, "private root")
	other := newTestCA(t, "someone else")
	c, k := ca.issue(t, 1001)
	for _, tc := range []struct {
		name     string
		serverCA *testCA
		ips      []net.IP
		want     string // "" = success
	}{
		{"right CA", ca, nil, ""},
		{"other CA", other, nil, "unknown authority"},
		{"other address", ca, []net.IP{net.IPv4(127, 0, 0, 2)}, "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newMTLSServer(t, tc.serverCA, ca, tc.ips...)
			s := newHTTP(t, sinks.HTTPConfig{URL: srv.srv.URL, TLS: tlsDir(t, ca.pem, c, k)})
			err := send(t, s, testMessage())
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("send: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("send to a server the CA bundle does not vouch for: %v; want an error with %q", err, tc.want)
			}
		})
	}
}

// TestCheckTLS: the files of sink.tls are checked at load, each problem
// under its key: a missing or empty CA bundle, a certificate without its key
// (or the reverse), a key that does not match the certificate, TLS files
// with an http URL.
func TestCheckTLS(t *testing.T) {
	ca := newTestCA(t, "root")
	c1, k1 := ca.issue(t, 1)
	_, k2 := ca.issue(t, 2)
	f := tlsDir(t, ca.pem, c1, k1)
	dir := t.TempDir()
	wrongKey := filepath.Join(dir, "wrong-key.pem")
	writeRename(t, wrongKey, string(k2))
	junk := filepath.Join(dir, "junk.pem")
	writeRename(t, junk, "not pem")
	const u = "https://psp.example/cb"
	for _, tc := range []struct {
		name string
		f    sinks.TLSFiles
		url  string
		want string
	}{
		{"good", f, u, ""},
		{"none", sinks.TLSFiles{}, "http://x", ""},
		{"ca only", sinks.TLSFiles{CAFile: f.CAFile}, u, ""},
		{"missing ca", sinks.TLSFiles{CAFile: f.CAFile + ".no"}, u, "tls.ca_file"},
		{"junk ca", sinks.TLSFiles{CAFile: junk}, u, "tls.ca_file"},
		{"cert without key", sinks.TLSFiles{CertFile: f.CertFile}, u, "tls.key_file"},
		{"key without cert", sinks.TLSFiles{KeyFile: f.KeyFile}, u, "tls.cert_file"},
		{"mismatched key", sinks.TLSFiles{CertFile: f.CertFile, KeyFile: wrongKey}, u, "tls.key_file"},
		{"junk key", sinks.TLSFiles{CertFile: f.CertFile, KeyFile: junk}, u, "tls.key_file"},
		{"junk cert", sinks.TLSFiles{CertFile: junk, KeyFile: f.KeyFile}, u, "tls.cert_file"},
		{"http url", f, "http://psp.example/cb", "tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range sinks.CheckTLS(tc.f, tc.url) {
				got = append(got, p.Key)
				if strings.Contains(p.Message, "PRIVATE KEY") {
					t.Errorf("message quotes the key: %s", p.Message)
				}
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("problems at %q, want %q", got, tc.want)
			}
		})
	}
	// NewHTTP refuses them too, with the key.
	_, err := sinks.NewHTTP(sinks.HTTPConfig{URL: u, TLS: sinks.TLSFiles{CertFile: f.CertFile, KeyFile: wrongKey}})
	if err == nil || !strings.Contains(err.Error(), "tls.key_file: ") || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("NewHTTP with a mismatched key: %v", err)
	}
	if _, err := os.Stat(wrongKey); err != nil {
		t.Fatal(err)
	}
}
