package testserver

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// NATSProcess is one nats-server process with JetStream on a loopback port
// and a store that stay the same across restarts: a test can stop it
// (SIGTERM: a graceful shutdown that writes the consumer state; SIGKILL: a
// crash) and start it again, as an operator's server restarts. The binary is
// [NATSServerBinary]'s.
type NATSProcess struct {
	// Addr is 127.0.0.1:port, the same across restarts.
	Addr string

	t      testing.TB
	bin    string
	store  string
	logDir string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	runs int
}

// StartNATSProcess starts a nats-server process on a free port with a fresh
// store and waits until it accepts connections. A cleanup stops it with
// SIGTERM and, when the test failed, logs the output of each run.
func StartNATSProcess(t testing.TB) *NATSProcess {
	t.Helper()
	p := &NATSProcess{t: t, bin: NATSServerBinary(t), Addr: "127.0.0.1:" + strconv.Itoa(FreePort(t)),
		store: filepath.Join(t.TempDir(), "nats"), logDir: t.TempDir()}
	p.Start()
	t.Cleanup(func() {
		p.Stop(syscall.SIGTERM)
		if t.Failed() {
			for i := 1; i <= p.runs; i++ {
				b, _ := os.ReadFile(p.logPath(i))
				t.Logf("nats-server run %d output:\n%s", i, b)
			}
		}
	})
	return p
}

// URL is the server's client URL.
func (p *NATSProcess) URL() string { return "nats://" + p.Addr }

// PID is the process id of the running server, 0 when it is stopped.
func (p *NATSProcess) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *NATSProcess) logPath(run int) string {
	return filepath.Join(p.logDir, fmt.Sprintf("run%d.log", run))
}

// Start starts the process (again, after Stop) on the same port and store
// and waits until it accepts connections.
func (p *NATSProcess) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.t.Fatal("nats-server already running")
	}
	host, port, _ := net.SplitHostPort(p.Addr)
	p.runs++
	logf, err := os.Create(p.logPath(p.runs))
	if err != nil {
		p.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(p.bin, "-a", host, "-p", port, "-js", "-sd", p.store)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = dieWithParent()
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	done := p.done
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	const ready = 20 * time.Second
	deadline := time.Now().Add(ready)
	for {
		c, err := net.DialTimeout("tcp", p.Addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return
		}
		select {
		case <-done:
			b, _ := os.ReadFile(logf.Name())
			p.t.Fatalf("nats-server process exited at start: %s", b)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("nats-server on %s not accepting connections after %s: %v", p.Addr, ready, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the process with sig (SIGTERM: graceful; SIGKILL: a crash) and
// waits until it exited, killing it after 15 s. It does nothing when the
// process is not running.
func (p *NATSProcess) Stop(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	p.cmd = nil
}
