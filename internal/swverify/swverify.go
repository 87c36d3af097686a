// Package swverify checks Standard Webhooks signatures in tests with an
// independent verifier: the scheme's reference JavaScript library (npm
// standardwebhooks, pinned in testdata/package-lock.json), run by the
// machine's Node.js. scripts/test.sh installs node and npm when missing and
// the library into testdata/node_modules. Without node or the library a test
// is skipped, except under CI=true, where that is a failure.
package swverify

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Request is one request as the receiver got it: its headers and body.
type Request struct {
	Header http.Header
	Body   []byte
}

// Dir returns the directory of the verifier (testdata beside this file).
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata")
}

// Verify runs the reference verifier on every request with each secret, in
// one node process, and returns per request, per secret, "" when new
// Webhook(secret).verify(body, headers) accepted it, else the verifier's
// error message. The verifier also checks the timestamp against its own
// clock (5 minutes of tolerance), so call it soon after the requests.
func Verify(t testing.TB, secrets []string, reqs []Request) [][]string {
	t.Helper()
	node := need(t)
	type dump struct {
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	in := struct {
		Secrets  []string `json:"secrets"`
		Requests []dump   `json:"requests"`
	}{Secrets: secrets, Requests: make([]dump, len(reqs))}
	for i, r := range reqs {
		h := map[string]string{}
		for name, values := range r.Header {
			h[strings.ToLower(name)] = strings.Join(values, ", ")
		}
		in.Requests[i] = dump{Headers: h, Body: string(r.Body)}
	}
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, filepath.Join(Dir(), "verify.js"))
	cmd.Dir = Dir()
	cmd.Stdin = bytes.NewReader(raw)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node verify.js: %v\n%s", err, stderr.String())
	}
	var res struct {
		Results [][]*string `json:"results"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("node verify.js: bad output %q: %v", out, err)
	}
	if len(res.Results) != len(reqs) {
		t.Fatalf("node verify.js: %d results for %d requests", len(res.Results), len(reqs))
	}
	t.Logf("standardwebhooks (node) verified %d requests with %d secrets in %s", len(reqs), len(secrets), time.Since(start).Round(time.Millisecond))
	got := make([][]string, len(reqs))
	for i, per := range res.Results {
		got[i] = make([]string, len(per))
		for j, e := range per {
			if e != nil {
				got[i][j] = *e
				if got[i][j] == "" {
					got[i][j] = "failed"
				}
			}
		}
	}
	return got
}

// need finds node and the installed library; without them the test is
// skipped, except under CI=true.
func need(t testing.TB) string {
	t.Helper()
	miss := func(what string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s (scripts/test.sh installs it)", what)
		}
		t.Skipf("%s; run scripts/test.sh to install it", what)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		if node, err = exec.LookPath("nodejs"); err != nil {
			miss("node not found")
		}
	}
	if _, err := os.Stat(filepath.Join(Dir(), "node_modules", "standardwebhooks", "package.json")); err != nil {
		miss("the npm package standardwebhooks is not installed in " + Dir())
	}
	return node
}
