package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// benchTB lets the benchmark start servers with internal/testserver, the
// one starter of each real server (it takes a testing.TB): Fatal panics
// with a tbFatal that tbRun recovers, Cleanup functions run at close.
// Methods testserver does not call are the nil embedded TB's and would
// panic.
type benchTB struct {
	testing.TB
	dir      string
	cleanups []func()
}

type tbFatal struct{ msg string }

func (b *benchTB) Helper()                   {}
func (b *benchTB) Failed() bool              { return false }
func (b *benchTB) Logf(string, ...any)       {}
func (b *benchTB) Cleanup(f func())          { b.cleanups = append(b.cleanups, f) }
func (b *benchTB) Fatal(args ...any)         { panic(tbFatal{fmt.Sprint(args...)}) }
func (b *benchTB) Fatalf(f string, a ...any) { panic(tbFatal{fmt.Sprintf(f, a...)}) }
func (b *benchTB) TempDir() string {
	d, err := os.MkdirTemp(b.dir, "tb-")
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// close runs the cleanups, last first.
func (b *benchTB) close() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
	b.cleanups = nil
}

// tbRun calls f and turns a Fatal inside it into an error.
func tbRun(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			tf, ok := r.(tbFatal)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("%s", tf.msg)
		}
	}()
	f()
	return nil
}

// natsProcEnv is a natsEnv whose server is a nats-server child process
// (testserver.StartNATSProcess, built from the module's nats-server
// version): what the benchmark process holds is then shaper's and
// nats.go's alone, without the server's own memory.
type natsProcEnv struct {
	*natsEnv
	tb   *benchTB
	proc *testserver.NATSProcess
}

// builtNATS is set once startNATSProcess had testserver build the
// nats-server binary in this process (removeNATSBinary).
var builtNATS atomic.Bool

// removeNATSBinary removes the directory of the nats-server binary that
// testserver built for this process (a fresh temporary one per process,
// ~23 MB), once no server of this process runs any more.
func removeNATSBinary() {
	if !builtNATS.Load() {
		return
	}
	_ = tbRun(func() { _ = os.RemoveAll(filepath.Dir(testserver.NATSServerBinary(&benchTB{}))) })
}

// startNATSProcess starts a nats-server child process with JetStream under
// dir and connects to it with opts.
func startNATSProcess(dir string, opts ...nats.Option) (*natsProcEnv, error) {
	builtNATS.Store(true)
	e := &natsProcEnv{tb: &benchTB{dir: dir}}
	if err := tbRun(func() { e.proc = testserver.StartNATSProcess(e.tb) }); err != nil {
		e.tb.close()
		return nil, err
	}
	nc, err := nats.Connect(e.proc.URL(), append([]nats.Option{nats.Name("shaper-bench")}, opts...)...)
	if err != nil {
		e.tb.close()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		e.tb.close()
		return nil, err
	}
	e.natsEnv = &natsEnv{nc: nc, js: js}
	return e, nil
}

func (e *natsProcEnv) close() {
	e.nc.Close()
	e.tb.close()
}

// pid is the server process's id.
func (e *natsProcEnv) pid() int { return e.proc.PID() }

// procStatus returns a field of /proc/<pid>/status in bytes (VmRSS, VmHWM:
// kB in the file), 0 when unknown; pid 0 is this process.
func procStatus(pid int, field string) uint64 {
	path := "/proc/self/status"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/status"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
