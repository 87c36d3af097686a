package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files into dir.
type testPKI struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newTestPKI(t *testing.T, dir string) testPKI {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shaper test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := testPKI{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// testOperator is an operator, a system account and an account with
// JetStream, trusted by an in-process server, and a user of that account
// whose .creds file is written into dir.
type testOperator struct {
	op       *jwt.OperatorClaims
	resolver *server.MemAccResolver
	sys      string
	creds    string // path of the user's .creds file
	userJWT  string
	seed     string // the user's nkey seed
}

func newTestOperator(t *testing.T, dir string) testOperator {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	op := jwt.NewOperatorClaims(opub)
	opJWT, err := op.Encode(okp)
	must(err)
	op, err = jwt.DecodeOperatorClaims(opJWT)
	must(err)
	res := &server.MemAccResolver{}
	account := func(name string, js bool) (nkeys.KeyPair, string) {
		akp, _ := nkeys.CreateAccount()
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		aJWT, err := ac.Encode(okp)
		must(err)
		must(res.Store(apub, aJWT))
		return akp, apub
	}
	_, sys := account("SYS", false)
	akp, _ := account("APP", true)
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = "shaper"
	uJWT, err := uc.Encode(akp)
	must(err)
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(uJWT, seed)
	must(err)
	path := filepath.Join(dir, "shaper.creds")
	must(os.WriteFile(path, creds, 0o600))
	return testOperator{op: op, resolver: res, sys: sys, creds: path, userJWT: uJWT, seed: string(seed)}
}

// TestNATSSecurity (issue 13): the daemon connects to a NATS server that
// requires TLS with client certificates (mTLS, certificates generated
// here) and JWT authentication (operator, account and user made here,
// nats.creds), runs a lane through it, reconnects with rotated CA and
// client certificate files (re-read at the reconnect, no restart), and
// neither its logs nor /metrics hold the user's JWT, nkey seed, or the
// client key.
func TestNATSSecurity(t *testing.T) {
	dir := t.TempDir()
	pki := newTestPKI(t, dir)
	opr := newTestOperator(t, dir)
	store := t.TempDir()
	start := func(pki testPKI, port int) *server.Server {
		t.Helper()
		tlsCfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.serverCert, KeyFile: pki.serverKey,
			CaFile: pki.ca, Verify: true})
		if err != nil {
			t.Fatal(err)
		}
		ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: store,
			NoLog: true, NoSigs: true, TLS: true, TLSVerify: true, TLSConfig: tlsCfg,
			TrustedOperators: []*jwt.OperatorClaims{opr.op}, AccountResolver: opr.resolver, SystemAccount: opr.sys})
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		return ns
	}
	ns := start(pki, -1)
	port := ns.Addr().(*net.TCPAddr).Port
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)

	// The server really asks for both: no creds, or no client certificate,
	// is refused.
	if nc, err := nats.Connect(url, nats.RootCAs(pki.ca), nats.ClientCert(pki.clientCert, pki.clientKey)); err == nil {
		nc.Close()
		t.Fatal("connected without creds")
	}
	if nc, err := nats.Connect(url, nats.RootCAs(pki.ca), nats.UserCredentials(opr.creds)); err == nil {
		nc.Close()
		t.Fatal("connected without a client certificate")
	}

	down, sinkURL := newStampedDownstream(t)
	admin := freeAddr(t)
	td := startDaemon(t, fmt.Sprintf(`
nats:
  url: %q
  creds: %q
  tls: { ca_file: %q, cert_file: %q, key_file: %q }
admin: { listen: %q }
log: { level: debug }
downstreams:
  sec:
    source: { stream: SEC, subjects: [sec.>] }
    rate: { limit: 50/s }
    sink: { kind: http, url: %q }
`, url, opr.creds, pki.ca, pki.clientCert, pki.clientKey, admin, sinkURL))
	waitReady(t, admin, 10*time.Second)

	nc, err := nats.Connect(url, nats.RootCAs(pki.ca), nats.ClientCert(pki.clientCert, pki.clientKey),
		nats.UserCredentials(opr.creds))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	keys := publishBurst(t, js, "sec.job", 20)
	if !down.awaitDistinct(len(keys), 10*time.Second) {
		t.Fatalf("delivered %d of %d through the secured connection; missing %v", down.distinctDelivered(), len(keys), down.missing(keys))
	}
	_, metricsText, _ := httpGet("http://" + admin + "/metrics")

	// Rotation: the server comes back with certificates of a new CA, and
	// the daemon's files are replaced by the new CA and a client
	// certificate it signed. The daemon reconnects with the new files,
	// without a restart.
	key, _ := os.ReadFile(pki.clientKey)
	nc.Close()
	ns.Shutdown()
	ns.WaitForShutdown()
	pki2 := newTestPKI(t, t.TempDir())
	for dst, src := range map[string]string{pki.ca: pki2.ca, pki.clientCert: pki2.clientCert, pki.clientKey: pki2.clientKey} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst+".new", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(dst+".new", dst); err != nil {
			t.Fatal(err)
		}
	}
	start(pki2, port)
	nc2, err := nats.Connect(url, nats.RootCAs(pki2.ca), nats.ClientCert(pki2.clientCert, pki2.clientKey),
		nats.UserCredentials(opr.creds))
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, _ := jetstream.New(nc2)
	msg := &nats.Msg{Subject: "sec.job", Header: nats.Header{}, Data: []byte("after rotation")}
	msg.Header.Set(jetstream.MsgIDHeader, "rotated")
	if _, err := js2.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	if !down.awaitDistinct(len(keys)+1, 10*time.Second) {
		t.Fatalf("nothing delivered after the certificates were rotated (%d distinct)", down.distinctDelivered())
	}
	waitReady(t, admin, 5*time.Second)
	td.stop(5 * time.Second)

	keyBody := strings.Split(strings.TrimSpace(string(key)), "\n")[1] // a line of the key's base64
	logs := td.logs.String()
	for what, secret := range map[string]string{"user JWT": opr.userJWT, "nkey seed": opr.seed,
		"seed prefix": opr.seed[:12], "client key": keyBody} {
		if strings.Contains(logs, secret) {
			t.Errorf("the daemon's logs hold the %s", what)
		}
		if strings.Contains(metricsText, secret) {
			t.Errorf("/metrics holds the %s", what)
		}
	}
	if !strings.Contains(logs, "shaper ready") {
		t.Errorf("no ready line in the logs:\n%s", logs)
	}
}

// TestNATSURLSecrets (issue 13): user and password, or a token, given by
// ${ENV} in nats.url reach the server (which requires them), and neither
// the logs nor /metrics show them.
func TestNATSURLSecrets(t *testing.T) {
	for _, tc := range []struct {
		name, url, secret string
		opt               testserver.NATSOption
	}{
		{"user and password", "nats://${NATS_TEST_USER}:${NATS_TEST_SECRET}@%s", "pw-9f3a1c77",
			testserver.WithUser("shaper", "pw-9f3a1c77")},
		{"token", "nats://${NATS_TEST_SECRET}@%s", "tok-5be01d2e",
			func(o *server.Options) { o.Authorization = "tok-5be01d2e" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testserver.NATS(t, tc.opt)
			t.Setenv("NATS_TEST_USER", "shaper")
			t.Setenv("NATS_TEST_SECRET", tc.secret)
			hostPort := ns.Addr().String()
			if nc, err := nats.Connect("nats://" + hostPort); err == nil {
				nc.Close()
				t.Fatal("the server takes clients without credentials")
			}
			down, sinkURL := newStampedDownstream(t)
			admin := freeAddr(t)
			td := startDaemon(t, fmt.Sprintf(`
nats: { url: %q }
admin: { listen: %q }
log: { level: debug }
downstreams:
  sec:
    source: { stream: SEC, subjects: [sec.>] }
    rate: { limit: 50/s }
    sink: { kind: http, url: %q }
`, fmt.Sprintf(tc.url, hostPort), admin, sinkURL))
			waitReady(t, admin, 10*time.Second)
			nc, err := nats.Connect(strings.NewReplacer("${NATS_TEST_USER}", "shaper", "${NATS_TEST_SECRET}", tc.secret).Replace(fmt.Sprintf(tc.url, hostPort)))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			keys := publishBurst(t, js, "sec.job", 10)
			if !down.awaitDistinct(len(keys), 10*time.Second) {
				t.Fatalf("delivered %d of %d", down.distinctDelivered(), len(keys))
			}
			_, metricsText, _ := httpGet("http://" + admin + "/metrics")
			td.stop(5 * time.Second)
			if logs := td.logs.String(); strings.Contains(logs, tc.secret) || strings.Contains(metricsText, tc.secret) {
				t.Errorf("the secret is in the logs or /metrics:\n%s", logs)
			}
		})
	}
}
