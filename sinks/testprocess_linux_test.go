//go:build linux

package sinks_test

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// testProcess is this test binary run again as a helper process (a
// downstream or a proxy in a process of its own, so that its reads compete
// with the process under test only for the CPU): it runs only the test
// named run, with env, and prints "LISTEN <addr>" once it listens.
type testProcess struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *bufio.Reader
	stopped bool
}

// startTestProcess starts it and returns it with the address it printed.
// The process is killed on cleanup unless stopped (and if this one dies).
func startTestProcess(t testing.TB, what, run string, env ...string) (*testProcess, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s process: %v", what, err)
	}
	p := &testProcess{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		if !p.stopped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			t.Fatalf("%s process did not start: %v", what, err)
		}
		if addr, ok := strings.CutPrefix(strings.TrimSpace(line), "LISTEN "); ok {
			return p, addr
		}
	}
}
