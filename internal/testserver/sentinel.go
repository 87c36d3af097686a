package testserver

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Sentinel is a real redis-sentinel process (Debian's redis-sentinel)
// watching one master, killed at the end of the test.
type Sentinel struct {
	// Addr is host:port.
	Addr string

	t   testing.TB
	cmd *exec.Cmd
	out *bytes.Buffer
}

// StartSentinel starts a redis-sentinel on a free loopback port that
// monitors master (host:port) as masterName with quorum 1, and notices a
// master that is down within downAfter (failover timeout 2 × downAfter,
// at least a second). It waits until the sentinel knows the master.
func StartSentinel(t testing.TB, masterName, master string, downAfter time.Duration) *Sentinel {
	t.Helper()
	bin := need(t, "redis-sentinel")
	port := FreePort(t)
	dir := t.TempDir()
	host, mport, _ := strings.Cut(master, ":")
	ms := max(100, downAfter.Milliseconds())
	conf := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
sentinel resolve-hostnames no
sentinel monitor %s %s %s 1
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, port, dir, masterName, host, mport, masterName, ms, masterName, max(1000, 2*ms), masterName)
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Sentinel{t: t, Addr: "127.0.0.1:" + strconv.Itoa(port), out: &bytes.Buffer{}}
	s.cmd = exec.Command(bin, path)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); _ = s.cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if Ping(s.Addr) == nil {
			if got := s.Master(masterName); got == master {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-sentinel on %s does not know master %s:\n%s", s.Addr, master, s.out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Master asks the sentinel for the address of masterName's master ("" when
// it does not know it).
func (s *Sentinel) Master(masterName string) string {
	s.t.Helper()
	lines := do(s.t, s.Addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", masterName)
	var vals []string
	for _, l := range lines {
		if l != "" && l[0] != '*' && l[0] != '$' {
			vals = append(vals, l)
		}
	}
	if len(vals) != 2 {
		return ""
	}
	return vals[0] + ":" + vals[1]
}

// Failover makes the sentinel fail masterName over to a replica at once
// (SENTINEL FAILOVER).
func (s *Sentinel) Failover(masterName string) {
	s.t.Helper()
	if got := do(s.t, s.Addr, "SENTINEL", "FAILOVER", masterName); len(got) == 0 || got[0] != "+OK" {
		s.t.Fatalf("SENTINEL FAILOVER %s: %v", masterName, got)
	}
}

// KnowsReplica reports whether the sentinel lists replica (host:port) as a
// replica of masterName that is not down.
func (s *Sentinel) KnowsReplica(masterName, replica string) bool {
	s.t.Helper()
	lines := do(s.t, s.Addr, "SENTINEL", "REPLICAS", masterName)
	host, port, _ := strings.Cut(replica, ":")
	for i := 0; i+2 < len(lines); i++ {
		if lines[i] == "name" && lines[i+2] == host+":"+port {
			return true
		}
	}
	return false
}
