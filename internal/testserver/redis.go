// Package testserver starts the real servers the tests run against (SPEC
// rule 1: real parts, not mocks): redis-server processes ([StartRedis]), a
// redis-sentinel ([StartSentinel]), a Redis Cluster ([StartRedisCluster]),
// in-process NATS servers ([NATS]), a nats-server process that can be
// stopped and restarted on its port and store ([StartNATSProcess]) and a
// JetStream cluster of nats-server processes ([StartCluster]). It is the one
// starter of each; tests of every package use it. Under CI=true a missing
// binary is a test failure, never a skip.
package testserver

import (
	"bufio"
	"bytes"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// need finds binary name on PATH; without it the test is skipped, except
// under CI=true, where that is a failure (scripts/test.sh installs it).
func need(t testing.TB, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found (scripts/test.sh installs it)", name)
		}
		t.Skipf("%s not found; run scripts/test.sh to install it", name)
	}
	return bin
}

// FreePort returns a loopback port that was free a moment ago, for a
// server the test starts in another process. It is drawn at random below
// the kernel's ephemeral range (ip_local_port_range), not from it: a port
// the kernel hands out for a listen on :0 is one it also hands out as the
// local port of outgoing connections, and the tests' own clients took
// one between FreePort's close and the server's bind (a 3-node
// nats-server cluster that never elected a meta leader in a CI run).
func FreePort(t testing.TB) int {
	t.Helper()
	lo := ephemeralLow()
	for range 200 {
		port := freePortMin + rand.IntN(lo-freePortMin)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			_ = ln.Close()
			return port
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a crowded range: the kernel's pick
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// freePortMin is the lowest port FreePort draws: above the well-known and
// most registered services' ports.
const freePortMin = 20000

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read, Linux's default), and more than freePortMin.
func ephemeralLow() int {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				lo = v
			}
		}
	}
	return max(lo, freePortMin+1000)
}

// Redis is a real redis-server on a free loopback port, without
// persistence, killed at the end of the test. It can be killed and started
// again on the same port (an outage).
type Redis struct {
	// Addr is host:port.
	Addr string

	t    testing.TB
	bin  string
	dir  string
	port int

	args []string // extra arguments (WithRedisArgs)
	env  []string // extra environment (WithSteppableClock)

	clockFile string // libfaketime's offset file (WithSteppableClock)

	mu  sync.Mutex
	cmd *exec.Cmd
	out *bytes.Buffer
}

// RedisOption adjusts a redis-server started by StartRedis.
type RedisOption func(*Redis)

// WithRedisArgs adds command-line arguments, e.g. "--replicaof", "127.0.0.1 6379".
func WithRedisArgs(args ...string) RedisOption {
	return func(r *Redis) { r.args = append(r.args, args...) }
}

// StartRedis starts a redis-server for t and waits until it answers PING.
func StartRedis(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	bin := need(t, "redis-server")
	port := FreePort(t)
	r := &Redis{t: t, bin: bin, dir: t.TempDir(), port: port, Addr: "127.0.0.1:" + strconv.Itoa(port)}
	for _, o := range opts {
		o(r)
	}
	r.Start()
	t.Cleanup(r.Kill)
	return r
}

// Start runs the server (again, after Kill) and waits until it answers PING.
func (r *Redis) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.t.Fatal("redis-server already running")
	}
	r.out = &bytes.Buffer{}
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no"}, r.args...)
	cmd := exec.Command(r.bin, args...)
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if len(r.env) > 0 {
		cmd.Env = append(os.Environ(), r.env...)
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.cmd = cmd
	deadline := time.Now().Add(5 * time.Second)
	for {
		if Ping(r.Addr) == nil {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("redis-server on %s did not answer:\n%s", r.Addr, r.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL (idempotent).
func (r *Redis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Do sends one command in RESP and returns the first line of the reply.
func (r *Redis) Do(args ...string) string {
	r.t.Helper()
	return do(r.t, r.Addr, args...)[0]
}

// do sends one command in RESP to addr and returns the reply's lines
// (all that arrive within 100 ms of the first one).
func do(t testing.TB, addr string, args ...string) []string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{strings.TrimSpace(line)}
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if strings.HasPrefix(line, "*") || strings.HasPrefix(line, "$") {
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				break
			}
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines
}

// Ping reports whether a Redis server at addr answers PING.
func Ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return net.UnknownNetworkError(line)
	}
	return nil
}
