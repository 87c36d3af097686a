package main

// The shaper binary, built once per test run, and its runs as child
// processes.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var shaperBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// buildShaper builds the shaper binary once per run of the package's tests
// (TestMain removes it) and returns its path.
func buildShaper(t *testing.T) string {
	t.Helper()
	shaperBin.once.Do(func() {
		goTool, err := exec.LookPath("go") // go test puts its own toolchain first on PATH
		if err != nil {
			shaperBin.err = err
			return
		}
		if shaperBin.dir, err = os.MkdirTemp("", "shaper-e2e-bin-"); err != nil {
			shaperBin.err = err
			return
		}
		shaperBin.path = filepath.Join(shaperBin.dir, "shaper")
		start := time.Now()
		cmd := exec.Command(goTool, "build", "-o", shaperBin.path, "github.com/shaper-dev/shaper/cmd/shaper")
		if out, err := cmd.CombinedOutput(); err != nil {
			shaperBin.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		t.Logf("built %s in %s", shaperBin.path, time.Since(start).Round(time.Millisecond))
	})
	if shaperBin.err != nil {
		t.Fatal(shaperBin.err)
	}
	return shaperBin.path
}

func removeShaperBin() {
	if shaperBin.dir != "" {
		_ = os.RemoveAll(shaperBin.dir)
	}
}

// child is the shaper binary running as a child process; its stdout and
// stderr go to files.
type child struct {
	cmd    *exec.Cmd
	stderr string // path of the stderr file
	done   chan struct{}
	err    error // of Wait, valid once done is closed
}

// startChild starts bin with args; a cleanup kills it if it still runs, and
// prints its stderr when the test failed or SHAPER_E2E_CHILD_LOGS is set.
func startChild(t *testing.T, bin string, args ...string) *child {
	t.Helper()
	dir := t.TempDir()
	outF, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errF, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(bin, args...), stderr: errF.Name(), done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = outF, errF
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = outF.Close()
	_ = errF.Close()
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() || os.Getenv("SHAPER_E2E_CHILD_LOGS") != "" {
			t.Logf("child %v stderr:\n%s", args, c.stderrText())
		}
	})
	return c
}

func (c *child) stderrText() string {
	b, _ := os.ReadFile(c.stderr)
	return string(b)
}

// wait waits up to timeout for the child to exit and returns its exit code
// (-1 and false on timeout).
func (c *child) wait(timeout time.Duration) (int, bool) {
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return -1, false
	}
}
