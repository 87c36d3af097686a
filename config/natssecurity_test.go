package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/shaper-dev/shaper/config"
)

// userCreds writes a creds file of a user signed by a new account, as nsc
// does, and returns its path.
func userCreds(t *testing.T, dir string) string {
	t.Helper()
	acct, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := user.PublicKey()
	tok, err := jwt.NewUserClaims(pub).Encode(acct)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	b, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "user.creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLoad_NATSSecurityFiles: shaper validate reads nats.creds and nats.tls
// as the start does (sources.Security.Check), so a config it passes is not
// stopped at the start with exit 1 (found by a new-user pass: a CA file of
// garbage, a key of another certificate and a truncated creds file all
// passed validate). Every problem is listed with its key, and none quotes
// what the files hold.
func TestLoad_NATSSecurityFiles(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir, "client")
	_, otherKey := selfSigned(t, dir, "other")
	creds := userCreds(t, dir)
	good, _ := os.ReadFile(creds)
	garbage := filepath.Join(dir, "garbage.pem")
	truncated := filepath.Join(dir, "truncated.creds")
	if err := os.WriteFile(garbage, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(truncated, good[:len(good)/3], 0o600); err != nil {
		t.Fatal(err)
	}
	nats := func(creds, ca, cert, key string) string {
		return fmt.Sprintf("nats: {url: 'tls://127.0.0.1:4222', creds: %q, tls: {ca_file: %q, cert_file: %q, key_file: %q}}", creds, ca, cert, key)
	}
	if _, _, err := config.Load(writeConfig(t, laneYAML(nats(creds, cert, cert, key))), nil); err != nil {
		t.Fatalf("valid creds, CA and pair: %v", err)
	}
	err := loadErr(t, laneYAML(nats(truncated, garbage, cert, otherKey)))
	requireProblem(t, err, "nats.creds", truncated, "holds no valid user JWT")
	requireProblem(t, err, "nats.tls.ca_file", garbage, "no PEM certificate")
	requireProblem(t, err, "nats.tls.key_file", otherKey, "private key does not match public key")
	seed := good[strings.Index(string(good), "SU") : strings.Index(string(good), "SU")+20]
	if strings.Contains(err.Error(), string(seed)) || strings.Contains(err.Error(), "garbage\n") {
		t.Errorf("an error quotes what a file holds: %v", err)
	}
	// A JWT with no seed after it.
	noSeed := filepath.Join(dir, "noseed.creds")
	if err := os.WriteFile(noSeed, good[:strings.Index(string(good), "************************* IMPORTANT")], 0o600); err != nil {
		t.Fatal(err)
	}
	requireProblem(t, loadErr(t, laneYAML(nats(noSeed, cert, cert, key))), "nats.creds", "holds no user nkey seed")
}
