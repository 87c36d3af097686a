package config_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
)

// selfSigned writes a self-signed certificate and its key into dir and
// returns their paths.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestLoad_SinkAuthTLS: sink.auth and sink.tls load with their defaults,
// ${ENV} in client_secret is expanded, and every problem of them is listed
// with its full key path (the rules are the sink's: sinks.CheckAuth,
// sinks.CheckTLS).
func TestLoad_SinkAuthTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir, "client")
	_, otherKey := selfSigned(t, dir, "other")
	t.Setenv("PSP_CLIENT_SECRET", "s3cret-from-env")

	c, warns := mustLoad(t, laneYAML("", "sink: {kind: http, url: 'https://psp.example/cb'}"))
	if got := c.Downstreams["payments"].Sink.Auth.Kind; got != "none" {
		t.Errorf("sink.auth.kind default %q, want none", got)
	}
	for _, w := range warns {
		if strings.Contains(w.Key, "sink.auth") || strings.Contains(w.Key, "sink.tls") {
			t.Errorf("unexpected warning %s", w)
		}
	}

	good := fmt.Sprintf(`sink: {kind: http, url: 'https://psp.example/cb',
      auth: {kind: oauth2, token_url: 'https://idp.example/token', client_id: shaper, client_secret: '${PSP_CLIENT_SECRET}',
             scopes: [callbacks], audience: 'https://psp.example', params: {resource: 'urn:psp'}},
      tls: {ca_file: %q, cert_file: %q, key_file: %q}}`, cert, cert, key)
	c, _ = mustLoad(t, laneYAML("", good))
	a := c.Downstreams["payments"].Sink.Auth
	if a.ClientSecret != "s3cret-from-env" || a.Params["resource"] != "urn:psp" || a.Scopes[0] != "callbacks" {
		t.Errorf("loaded sink.auth %+v", a)
	}

	bad := fmt.Sprintf(`sink: {kind: http, url: 'https://psp.example/cb', headers: {authorization: 'Bearer x'},
      auth: {kind: oauth2, token_url: 'idp', client_secret: '${PSP_CLIENT_SECRET}', params: {grant_type: password}},
      tls: {cert_file: %q, key_file: %q}}`, cert, otherKey)
	err := loadErr(t, laneYAML("", bad))
	p := "downstreams.payments.sink."
	requireProblem(t, err, p+"auth.token_url", "absolute")
	requireProblem(t, err, p+"auth.client_id", "required")
	requireProblem(t, err, p+"auth.params.grant_type", "reserved")
	requireProblem(t, err, p+"headers.authorization", "reserved")
	requireProblem(t, err, p+"tls.key_file", "does not match")
	if strings.Contains(err.Error(), "s3cret-from-env") {
		t.Errorf("an error shows the client secret:\n%v", err)
	}

	err = loadErr(t, laneYAML("", fmt.Sprintf("sink: {kind: http, url: 'https://psp.example/cb', tls: {cert_file: %q}}", cert)))
	requireProblem(t, err, p+"tls.key_file", "required")
	err = loadErr(t, laneYAML("", "sink: {kind: http, url: 'https://psp.example/cb', auth: {kind: basic}}"))
	requireProblem(t, err, p+"auth.kind", "basic")
	err = loadErr(t, laneYAML("", "sink: {kind: http, url: 'https://psp.example/cb', auth: {kind: bearer_file, path: '/nonexistent/token'}}"))
	requireProblem(t, err, p+"auth.path", "/nonexistent/token")
}

// TestRedacted_SinkAuth: client_secret never shows in Redacted, whether it
// came from ${ENV} (shown as the reference) or was written in the file
// (shown as [REDACTED], with a warning at load); params whose name suggests
// a secret are hidden too.
func TestRedacted_SinkAuth(t *testing.T) {
	t.Setenv("PSP_CLIENT_SECRET", "s3cret-from-env")
	text := func(secret string) string {
		return laneYAML("", "sink: {kind: http, url: 'https://psp.example/cb', auth: {kind: oauth2, token_url: 'https://idp.example/token', client_id: shaper, client_secret: '"+secret+"', params: {client_assertion_type: jwt, api_key: k-123}}}")
	}
	c, _ := mustLoad(t, text("${PSP_CLIENT_SECRET}"))
	r := c.Redacted()
	if got := r.Downstreams["payments"].Sink.Auth.ClientSecret; got != "${PSP_CLIENT_SECRET}" {
		t.Errorf("Redacted client_secret %q, want the reference", got)
	}
	if c.Downstreams["payments"].Sink.Auth.ClientSecret != "s3cret-from-env" {
		t.Errorf("Redacted changed the config it was called on")
	}
	if dump := fmt.Sprintf("%+v", *r); strings.Contains(dump, "s3cret-from-env") || strings.Contains(dump, "k-123") {
		t.Errorf("Redacted shows a secret: %s", dump)
	}

	c, warns := mustLoad(t, text("literal-secret"))
	if got := c.Redacted().Downstreams["payments"].Sink.Auth.ClientSecret; got != "[REDACTED]" {
		t.Errorf("Redacted literal client_secret %q, want [REDACTED]", got)
	}
	warned := false
	for _, w := range warns {
		warned = warned || w.Key == "downstreams.payments.sink.auth.client_secret"
		if strings.Contains(w.String(), "literal-secret") {
			t.Errorf("a warning shows the secret: %s", w)
		}
	}
	if !warned {
		t.Errorf("no warning for a client_secret written in the file: %v", warns)
	}
}

// TestLoad_SinkTLSBesideUnsetSecret: an unset ${NAME} in sink.auth (the
// oauth2 client_secret) or in sink.url does not hide the problems of
// sink.tls: validate lists the secret and the key that is not the
// certificate's, and simulate (SecretsOptional), which lets the secret be,
// still judges the readable files (found by a new-user pass: the key
// mismatch vanished while the secret was unset).
func TestLoad_SinkTLSBesideUnsetSecret(t *testing.T) {
	dir := t.TempDir()
	cert, _ := selfSigned(t, dir, "client")
	_, otherKey := selfSigned(t, dir, "other")
	for _, url := range []string{"https://psp.example/cb", "${SHAPER_TEST_UNSET_SINK_URL}"} {
		text := laneYAML("", fmt.Sprintf(`sink: {kind: http, url: %q, auth: {kind: oauth2, token_url: "https://auth.example/token", client_id: shaper, client_secret: "${SHAPER_TEST_UNSET_CLIENT_SECRET}"}, tls: {cert_file: %q, key_file: %q}}`, url, cert, otherKey))
		err := loadErr(t, text)
		requireProblem(t, err, lanePfx+"sink.auth.client_secret", "${SHAPER_TEST_UNSET_CLIENT_SECRET}")
		requireProblem(t, err, lanePfx+"sink.tls.key_file", "private key does not match public key")
		if _, _, err := config.Load(writeConfig(t, text), nil, config.SecretsOptional()); err == nil {
			t.Errorf("url %s: SecretsOptional passed a key that is not the certificate's", url)
		} else {
			requireProblem(t, err, lanePfx+"sink.tls.key_file", "private key does not match public key")
		}
	}
}

// TestLoad_SinkURLUserInfoBesideAuthorization: user info in sink.url next
// to sink.auth or an Authorization header is a warning on sink.url (net/http
// sends the header and drops the user info), and the warning shows no
// password.
func TestLoad_SinkURLUserInfoBesideAuthorization(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("tok-abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, extra := range []string{fmt.Sprintf("auth: {kind: bearer_file, path: %q}", token), `headers: {Authorization: "Bearer x"}`, ""} {
		_, warns := mustLoad(t, laneYAML("", fmt.Sprintf(`sink: {kind: http, url: "https://u:Pw5ecret@psp.example/cb", %s}`, extra)))
		var got []string
		for _, w := range warns {
			if w.Key == lanePfx+"sink.url" && strings.Contains(w.Message, "user info (basic auth) is not sent") {
				got = append(got, w.Message)
			}
			if strings.Contains(w.Message, "Pw5ecret") {
				t.Errorf("a warning shows the password: %s", w)
			}
		}
		if want := extra != ""; (len(got) == 1) != want {
			t.Errorf("with %q: warnings on sink.url %q, want one: %v", extra, got, want)
		}
	}
}
