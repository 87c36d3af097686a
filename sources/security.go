package sources

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// Security is how the daemon authenticates to the NATS servers and encrypts
// the connection (nats.creds, nats.tls). User and password or a token come
// in the URL. The zero value adds nothing.
type Security struct {
	// Creds is a .creds file (user JWT and nkey seed); "" = none.
	Creds string
	// CAFile, CertFile and KeyFile are PEM files: the CAs of the servers
	// ("" = the system's roots) and the client certificate with its key.
	// Any of them set turns TLS on.
	CAFile, CertFile, KeyFile string
}

// Options returns the nats.go options of s. Every file is read once here,
// so that a missing or broken one fails the start with its key, and again
// at every (re)connect by nats.go (UserCredentials reads the creds file for
// each connection, RootCAs and ClientCert load their files in each TLS
// handshake), so that rotated files apply from the next connection on
// without a restart. Nothing read from them is ever logged.
func (s Security) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if s.Creds != "" {
		if _, err := os.ReadFile(s.Creds); err != nil {
			return nil, fmt.Errorf("nats.creds: %w", err)
		}
		opts = append(opts, nats.UserCredentials(s.Creds))
	}
	if s.CAFile == "" && s.CertFile == "" && s.KeyFile == "" {
		return opts, nil
	}
	opts = append(opts, nats.Secure())
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return nil, fmt.Errorf("nats.tls.ca_file: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("nats.tls.ca_file %s: no PEM certificate in it", s.CAFile)
		}
		opts = append(opts, nats.RootCAs(s.CAFile))
	}
	if s.CertFile != "" || s.KeyFile != "" {
		// The error names the files and the format, never key material.
		if _, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile); err != nil {
			return nil, fmt.Errorf("nats.tls.cert_file/key_file: %w", err)
		}
		opts = append(opts, nats.ClientCert(s.CertFile, s.KeyFile))
	}
	return opts, nil
}
