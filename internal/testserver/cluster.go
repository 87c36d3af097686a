package testserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The nats-server binary of the cluster tests is built from the nats-server
// module this project already depends on (go.mod), with the Go toolchain
// that runs the tests: nothing else needs installing on a fresh machine. It
// is built once per test process into the temporary directory.
var natsBin struct {
	once sync.Once
	path string
	err  error
}

// NATSServerBinary returns the path of a nats-server binary built from the
// module's nats-server version.
func NATSServerBinary(t testing.TB) string {
	t.Helper()
	natsBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "shaper-nats-server-")
		if err != nil {
			natsBin.err = err
			return
		}
		natsBin.path = filepath.Join(dir, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsBin.path, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsBin.err = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsBin.err != nil {
		t.Fatal(natsBin.err)
	}
	return natsBin.path
}

// Cluster is a JetStream cluster of nats-server processes on loopback.
type Cluster struct {
	t     testing.TB
	bin   string
	Nodes []*Node
}

// Node is one server of a Cluster.
type Node struct {
	Name    string
	Port    int // client port
	Monitor int // HTTP monitoring port
	Cluster int // route port
	dir     string
	args    []string

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// URL is the node's client URL.
func (n *Node) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.Port) }

// StartCluster starts n nats-server processes (n ≥ 3 for R3 streams) with
// JetStream and routes between them, and waits until every node reports
// healthy (JetStream meta leader known). Cleanups kill them.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, bin: NATSServerBinary(t)}
	for i := range n {
		c.Nodes = append(c.Nodes, &Node{Name: "n" + strconv.Itoa(i+1), Port: FreePort(t), Monitor: FreePort(t),
			Cluster: FreePort(t), dir: t.TempDir()})
	}
	var routes []string
	for _, nd := range c.Nodes {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(nd.Cluster))
	}
	for _, nd := range c.Nodes {
		nd.args = []string{"-a", "127.0.0.1", "-p", strconv.Itoa(nd.Port), "-m", strconv.Itoa(nd.Monitor),
			"-n", nd.Name, "-js", "-sd", nd.dir, "--cluster_name", "shaper-test",
			"--cluster", "nats://127.0.0.1:" + strconv.Itoa(nd.Cluster), "--routes", strings.Join(routes, ",")}
		c.start(nd)
	}
	t.Cleanup(func() {
		for _, nd := range c.Nodes {
			c.Kill(nd)
		}
	})
	for _, nd := range c.Nodes {
		c.WaitHealthy(nd, 30*time.Second)
	}
	c.waitStreams(60 * time.Second)
	return c
}

// waitStreams waits until the cluster creates (and deletes) a stream
// replicated on every node, each try with 5 s, the JetStream API's default
// deadline that the daemon uses: healthy nodes with a meta leader may
// still be too slow for their first stream on a loaded machine (a CI run:
// the daemon's first stream timed out at start, 5 s after the cluster
// reported healthy).
func (c *Cluster) waitStreams(timeout time.Duration) {
	c.t.Helper()
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TESTSERVER_PROBE",
			Subjects: []string{"testserver.probe"}, Replicas: len(c.Nodes), Storage: jetstream.MemoryStorage})
		if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = js.DeleteStream(ctx, "TESTSERVER_PROBE")
		}
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the cluster created no R%d stream within %s: %v", len(c.Nodes), timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// URLs is the comma-separated list of the nodes' client URLs (nats.url).
func (c *Cluster) URLs() string {
	var u []string
	for _, nd := range c.Nodes {
		u = append(u, nd.URL())
	}
	return strings.Join(u, ",")
}

func (c *Cluster) start(nd *Node) {
	c.t.Helper()
	nd.mu.Lock()
	defer nd.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(nd.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(c.bin, nd.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	nd.cmd, nd.log = cmd, f
}

// Kill stops nd with SIGKILL (idempotent): no clean shutdown, no leadership
// handed over.
func (c *Cluster) Kill(nd *Node) {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return
	}
	_ = nd.cmd.Process.Signal(syscall.SIGKILL)
	_ = nd.cmd.Wait()
	_ = nd.log.Close()
	nd.cmd = nil
}

// Restart starts a killed node again with its store and waits until it is
// healthy.
func (c *Cluster) Restart(nd *Node) {
	c.t.Helper()
	c.start(nd)
	c.WaitHealthy(nd, 30*time.Second)
}

// WaitHealthy waits until nd's /healthz answers 200 (JetStream current).
func (c *Cluster) WaitHealthy(nd *Node, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	url := "http://127.0.0.1:" + strconv.Itoa(nd.Monitor) + "/healthz"
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(nd.dir, "server.log"))
			c.t.Fatalf("nats-server %s not healthy within %s; its log but the health checks:\n%s", nd.Name, timeout, tail(withoutHealthChecks(string(log)), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// NodeByName returns the node named name (as the server reports its name,
// e.g. a stream's leader), or nil.
func (c *Cluster) NodeByName(name string) *Node {
	for _, nd := range c.Nodes {
		if nd.Name == name {
			return nd
		}
	}
	return nil
}

// withoutHealthChecks drops the log lines of WaitHealthy's own probes
// ("Healthcheck failed"), which fill a log in 30 s and hid its cause.
func withoutHealthChecks(log string) string {
	var b strings.Builder
	for line := range strings.Lines(log) {
		if !strings.Contains(line, "Healthcheck failed") {
			b.WriteString(line)
		}
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
