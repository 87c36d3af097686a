package sinks

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sync/atomic"

	"github.com/shaper-dev/shaper/internal/filewatch"
)

// TLSFiles is the sink.tls key of an HTTP sink (SPEC §4): PEM files of the
// CA bundle the downstream's certificate must chain to, and of the client
// certificate and key presented to it (mTLS). Every field is optional, but
// CertFile and KeyFile go together. Check it with [CheckTLS]. The files are
// re-read when they change, with no restart: new connections use the new
// files; connections already open keep theirs until they close (the sink
// closes its idle ones after each change).
type TLSFiles struct {
	// CAFile replaces the system's roots for the downstream: its
	// certificate must chain to one of the bundle's (and name the URL's
	// host). "" = the system's roots.
	CAFile string
	// CertFile is the client certificate chain, leaf first.
	CertFile string
	// KeyFile is the private key of CertFile's leaf; a secret: never
	// logged or quoted.
	KeyFile string
}

// IsZero reports whether no file is set (plain system TLS).
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// CheckTLS returns the problems of a sink.tls configuration for the sink
// URL sinkURL: the files must exist and parse, the key must match the
// certificate (tls.X509KeyPair), a certificate needs its key and a key its
// certificate, and TLS files need an https URL.
func CheckTLS(f TLSFiles, sinkURL string) []*ConfigProblem {
	if f.IsZero() {
		return nil
	}
	var ps []*ConfigProblem
	add := func(key string, err error) { ps = append(ps, &ConfigProblem{Key: key, Message: err.Error()}) }
	if u, err := url.Parse(sinkURL); err == nil && u.Scheme == "http" {
		add("tls", errors.New("set, but url is http://: TLS files need an https URL"))
	}
	if f.CAFile != "" {
		if _, err := loadCA(f.CAFile); err != nil {
			add("tls.ca_file", err)
		}
	}
	switch {
	case f.CertFile != "" && f.KeyFile == "":
		add("tls.key_file", errors.New("required with tls.cert_file (the client certificate's private key)"))
	case f.CertFile == "" && f.KeyFile != "":
		add("tls.cert_file", errors.New("required with tls.key_file (the client certificate)"))
	case f.CertFile != "":
		if _, key, err := loadPair(f.CertFile, f.KeyFile); err != nil {
			add(key, err)
		}
	}
	return ps
}

// loadCA reads a PEM bundle of at least one certificate.
func loadCA(path string) (*x509.CertPool, error) {
	pem, err := readFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%q holds no PEM certificate", path)
	}
	return pool, nil
}

// loadPair reads a certificate and its key; on failure it names the key
// path (relative to the sink) of the file at fault.
func loadPair(certFile, keyFile string) (*tls.Certificate, string, error) {
	certPEM, err := readFile(certFile)
	if err != nil {
		return nil, "tls.cert_file", err
	}
	keyPEM, err := readFile(keyFile)
	if err != nil {
		return nil, "tls.key_file", err
	}
	if !hasCert(certPEM) {
		return nil, "tls.cert_file", fmt.Errorf("%q holds no PEM certificate", certFile)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// crypto/tls's messages name the problem ("private key does not
		// match public key", "failed to find any PEM data in key input"),
		// never the key.
		return nil, "tls.key_file", fmt.Errorf("%q with tls.cert_file %q: %v", keyFile, certFile, err)
	}
	return &pair, "", nil
}

func hasCert(pemBytes []byte) bool {
	return x509.NewCertPool().AppendCertsFromPEM(pemBytes)
}

// readFile reads a file; the error names it and the cause only.
func readFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("%q cannot be read: %v", path, err)
	}
	return b, nil
}

// tlsReloader holds the current contents of TLSFiles and serves them to new
// connections: the client certificate through
// tls.Config.GetClientCertificate, the CA bundle through the verification
// in VerifyConnection (tls.Config.RootCAs cannot change once the transport
// uses the config).
type tlsReloader struct {
	files TLSFiles
	host  string // the sink URL's host, which the server's certificate must name
	log   *slog.Logger
	cert  atomic.Pointer[tls.Certificate]
	roots atomic.Pointer[x509.CertPool]
	stop  func()
	// transport is the sink's own, whose idle connections close after a
	// reload so that the next requests handshake with the new files.
	transport atomic.Pointer[http.Transport]
}

// newTLSReloader loads f and watches its files.
func newTLSReloader(f TLSFiles, host string, log *slog.Logger) (*tlsReloader, error) {
	r := &tlsReloader{files: f, host: host, log: log, stop: func() {}}
	if p := r.load(); p != nil {
		return nil, p
	}
	var paths []string
	for _, p := range []string{f.CAFile, f.CertFile, f.KeyFile} {
		if p != "" {
			paths = append(paths, p)
		}
	}
	stop, err := filewatch.Watch(paths, fileDebounce, func() {
		if p := r.load(); p != nil {
			log.Warn("sink kept its TLS files: the changed ones did not load", "key", "sink."+p.Key, "err", p.Message)
			return
		}
		log.Info("sink reloaded its TLS files; new connections use them")
		if t := r.transport.Load(); t != nil {
			t.CloseIdleConnections()
		}
	})
	if err != nil {
		log.Warn("sink TLS files not watched: they apply at the next start or reload", "err", err)
	}
	r.stop = stop
	return r, nil
}

// load reads every file; nothing changes unless all of them load.
func (r *tlsReloader) load() *ConfigProblem {
	var pool *x509.CertPool
	if r.files.CAFile != "" {
		var err error
		if pool, err = loadCA(r.files.CAFile); err != nil {
			return &ConfigProblem{Key: "tls.ca_file", Message: err.Error()}
		}
	}
	var pair *tls.Certificate
	if r.files.CertFile != "" {
		var key string
		var err error
		if pair, key, err = loadPair(r.files.CertFile, r.files.KeyFile); err != nil {
			return &ConfigProblem{Key: key, Message: err.Error()}
		}
	}
	if pool != nil {
		r.roots.Store(pool)
	}
	if pair != nil {
		r.cert.Store(pair)
	}
	return nil
}

// config returns the client TLS configuration for the sink's transport.
func (r *tlsReloader) config() *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.files.CertFile != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.cert.Load(), nil
		}
	}
	if r.files.CAFile != "" {
		// The standard verification with the roots of the moment: the chain
		// to ca_file's bundle and the host name, as crypto/tls would check
		// them with RootCAs (x509.Certificate.Verify, DNSName).
		c.InsecureSkipVerify = true //nolint:gosec // verified in VerifyConnection below
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the server sent no certificate")
			}
			name := cs.ServerName
			if name == "" { // no SNI: an IP address
				name = r.host
			}
			opts := x509.VerifyOptions{Roots: r.roots.Load(), DNSName: name, Intermediates: x509.NewCertPool()}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return c
}

func (r *tlsReloader) close() { r.stop() }
