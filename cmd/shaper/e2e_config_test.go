package main

// Configuration of the end-to-end tests: a lane's keys, the config file,
// free addresses.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// laneSpec holds the lane keys the tests vary; the rest are the defaults.
type laneSpec struct {
	name        string // lane name; subjects are e2e.<name>.>
	stream      string
	limit       string // e.g. "100/s"
	capacity    int
	maxInFlight int
	timeout     string // task.timeout
	backoff     string // task.retry.backoff, YAML list
	sinkURL     string
}

// subject is the subject the tests publish the lane's jobs to.
func (l laneSpec) subject() string { return "e2e." + l.name + ".job" }

// configYAML renders a config with the embedded NATS server on natsListen
// (storing in storeDir), the admin endpoint on adminListen, and one lane.
func configYAML(natsListen, storeDir, adminListen, drainTimeout string, l laneSpec) string {
	return fmt.Sprintf(`
nats:
  url: ""
  embedded: { listen: %q, store_dir: %q }
admin: { listen: %q }
log: { level: info, format: text }
shutdown: { drain_timeout: %s }
downstreams:
  %s:
    source: { stream: %s, subjects: [%q], ack_wait: 60s, max_deliver: 5 }
    bucket: { capacity: %d, overflow: block }
    rate: { limit: %s }
    task: { timeout: %s, max_in_flight: %d, retry: { backoff: %s } }
    sink: { kind: http, url: %q, method: POST, success_status: [2xx] }
`, natsListen, storeDir, adminListen, drainTimeout, l.name, l.stream, "e2e."+l.name+".>",
		l.capacity, l.limit, l.timeout, l.maxInFlight, l.backoff, l.sinkURL)
}

// writeFile writes body to name in a fresh temporary directory and returns
// its path.
func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
