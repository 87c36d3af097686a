package main

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
)

// The real servers of sections 6 and 9 (a redis-server, a nats-server
// process) come from internal/testserver, the project's one starter of each.
// Its starters take a testing.TB; the benchmark is a command, so serverTB
// plays that part for the few methods the starters use.

// serverTB is the testing.TB of withServers. Only the methods below are
// implemented; the embedded nil interface makes any other call panic, which
// withServers reports as an error rather than a crash.
type serverTB struct {
	testing.TB

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	logs     []string
}

// errServer carries a starter's Fatal or Skip out of withServers.
type errServer struct{ msg string }

func (e errServer) Error() string { return e.msg }

func (t *serverTB) Helper()      {}
func (t *serverTB) Name() string { return "bench" }

func (t *serverTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *serverTB) fail(msg string) {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	panic(errServer{msg})
}

func (t *serverTB) Fatal(args ...any)                 { t.fail(fmt.Sprint(args...)) }
func (t *serverTB) Fatalf(format string, args ...any) { t.fail(fmt.Sprintf(format, args...)) }
func (t *serverTB) Skip(args ...any)                  { t.fail("skipped: " + fmt.Sprint(args...)) }
func (t *serverTB) Skipf(format string, args ...any) {
	t.fail("skipped: " + fmt.Sprintf(format, args...))
}

func (t *serverTB) Error(args ...any) { t.Errorf("%s", fmt.Sprint(args...)) }
func (t *serverTB) Errorf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
	t.logs = append(t.logs, fmt.Sprintf(format, args...))
}

func (t *serverTB) Logf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.logs = append(t.logs, fmt.Sprintf(format, args...))
}

func (t *serverTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// TempDir makes a directory removed by the cleanups.
func (t *serverTB) TempDir() string {
	dir, err := os.MkdirTemp("", "shaper-bench-server-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// withServers runs f with a serverTB, then runs the cleanups the starters
// registered (last first: servers stop before their directories go). A
// starter's Fatal or Skip, and any error f returns, is the error.
func withServers(f func(tb testing.TB) error) (err error) {
	t := &serverTB{}
	defer func() {
		if p := recover(); p != nil {
			var es errServer
			if e, ok := p.(error); ok && errors.As(e, &es) {
				err = es
			} else {
				err = fmt.Errorf("server starter: %v", p)
			}
		}
		t.mu.Lock()
		cs := t.cleanups
		t.cleanups = nil
		t.mu.Unlock()
		for i := len(cs) - 1; i >= 0; i-- {
			cs[i]()
		}
		if err == nil && t.Failed() {
			err = fmt.Errorf("server: %v", t.logs)
		}
	}()
	return f(t)
}
