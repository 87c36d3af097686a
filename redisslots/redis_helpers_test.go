package redisslots

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper/shapertest"

	"go.uber.org/goleak"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redisServer is a real redis-server on a free loopback port, without
// persistence, killed at the end of the test. It can be killed and started
// again on the same port (an outage).
type redisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	addr string

	mu  sync.Mutex
	cmd *exec.Cmd
	out *bytes.Buffer
}

// startRedis starts a redis-server for t. Without the binary the test is
// skipped, except in CI (CI=true), where that is a failure: scripts/test.sh
// installs it.
func startRedis(t *testing.T) *redisServer { return startRedisTB(t) }

func startRedisTB(t testing.TB) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found (scripts/test.sh installs it)")
		}
		t.Skip("redis-server not found; run scripts/test.sh to install it")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r := &redisServer{t: t, bin: bin, dir: t.TempDir(), port: port, addr: "127.0.0.1:" + strconv.Itoa(port)}
	r.start()
	t.Cleanup(r.kill)
	return r
}

// start runs the server and waits until it answers PING.
func (r *redisServer) start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.t.Fatal("redis-server already running")
	}
	r.out = &bytes.Buffer{}
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.cmd = cmd
	deadline := time.Now().Add(5 * time.Second)
	for {
		if redisPing(r.addr) == nil {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("redis-server on %s did not answer:\n%s", r.addr, r.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill stops the server with SIGKILL (idempotent).
func (r *redisServer) kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// do sends one command in RESP and returns the first line of the reply.
func (r *redisServer) do(args ...string) string {
	r.t.Helper()
	c, err := net.DialTimeout("tcp", r.addr, time.Second)
	if err != nil {
		r.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		r.t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		r.t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

func redisPing(addr string) error {
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

// newSlots returns a RedisSlots for addr with the given options, closed at
// the end of the test, with the script loaded.
func newSlots(t *testing.T, addr string, opts ...RedisOption) *RedisSlots {
	t.Helper()
	rs, err := NewRedisSlots(config.Redis{Addr: addr, KeyPrefix: "test", Timeout: 50 * time.Millisecond, ReplicasHint: 1}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rs.Load(ctx); err != nil {
		t.Fatal(err)
	}
	return rs
}

// maxIn returns the largest number of sorted instants in a half-open window
// [t, t+w).
func maxIn(ts []time.Time, w time.Duration) int {
	n, _ := shapertest.MaxInWindow(ts, w)
	return n
}

// maxInClosed returns the largest number of sorted instants in a closed
// window [t, t+w].
func maxInClosed(ts []time.Time, w time.Duration) int {
	n, _ := shapertest.MaxInClosedWindow(ts, w)
	return n
}

// sleepUntil sleeps until t (about 1 ms late, as Go's timers are here).
func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// slotReq is a reservation at interval iv with no slack and the default
// min_spacing.
func slotReq(iv time.Duration) drain.SlotRequest {
	return drain.SlotRequest{Interval: iv, MinSpacing: shaper.DefaultMinSpacing}
}
