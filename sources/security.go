package sources

import (
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/shaper-dev/shaper/sinks"
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

// SecurityProblem is a file of Security that would stop the start: its
// config key (nats.creds, nats.tls.ca_file, nats.tls.cert_file,
// nats.tls.key_file) and what is wrong, never what the file holds.
type SecurityProblem struct{ Key, Message string }

// Check reads every file of s as the start does and returns a problem per
// file that would fail it: unreadable, a creds file without a user JWT and
// its nkey seed (what nats.go's UserCredentials needs), a CA file with no
// PEM certificate, a certificate and key that do not load as a pair. Options
// fails on the first of them; shaper validate lists them all
// (config.Validate), so that a config validate passes does not stop the
// start with exit 1.
func (s Security) Check() []SecurityProblem {
	var ps []SecurityProblem
	add := func(key, format string, a ...any) {
		ps = append(ps, SecurityProblem{Key: key, Message: fmt.Sprintf(format, a...)})
	}
	if s.Creds != "" {
		if b, err := os.ReadFile(s.Creds); err != nil {
			add("nats.creds", "cannot be read: %v", err)
		} else if err := checkCreds(b); err != nil {
			add("nats.creds", "%s: %v", s.Creds, err)
		}
	}
	// The TLS files by the sink's rule (sinks.CheckTLS: the one place of
	// it), under nats.tls; a certificate and its key go together.
	files := sinks.TLSFiles{CAFile: s.CAFile}
	if (s.CertFile == "") != (s.KeyFile == "") {
		add("nats.tls.cert_file", "nats.tls.cert_file and nats.tls.key_file go together (a client certificate and its key)")
	} else {
		files.CertFile, files.KeyFile = s.CertFile, s.KeyFile
	}
	for _, p := range sinks.CheckTLS(files, "") {
		add("nats."+p.Key, "%s", p.Message)
	}
	return ps
}

// checkCreds is what nats.go's UserCredentials reads from a creds file: a
// user JWT and a user nkey seed. The errors name neither.
func checkCreds(b []byte) error {
	tok, err := nkeys.ParseDecoratedJWT(b)
	if err == nil {
		_, err = jwt.DecodeUserClaims(tok)
	}
	if err != nil {
		return errors.New("holds no valid user JWT")
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("holds no user nkey seed (%w)", err)
	}
	kp.Wipe()
	return nil
}

// Options returns the nats.go options of s. Every file is read once here
// (Check), so that a missing or broken one fails the start with its key,
// and again at every (re)connect by nats.go (UserCredentials reads the
// creds file for each connection, RootCAs and ClientCert load their files
// in each TLS handshake), so that rotated files apply from the next
// connection on without a restart. Nothing read from them is ever logged.
func (s Security) Options() ([]nats.Option, error) {
	if ps := s.Check(); len(ps) > 0 {
		return nil, fmt.Errorf("%s: %s", ps[0].Key, ps[0].Message)
	}
	var opts []nats.Option
	if s.Creds != "" {
		opts = append(opts, nats.UserCredentials(s.Creds))
	}
	if s.CAFile == "" && s.CertFile == "" && s.KeyFile == "" {
		return opts, nil
	}
	opts = append(opts, nats.Secure())
	if s.CAFile != "" {
		opts = append(opts, nats.RootCAs(s.CAFile))
	}
	if s.CertFile != "" {
		opts = append(opts, nats.ClientCert(s.CertFile, s.KeyFile))
	}
	return opts, nil
}
