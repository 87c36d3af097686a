//go:build linux

package sinks_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The environment of the proxy process (startWireProxyProcess).
const (
	envWireProxyUpstream = "SHAPER_TEST_WIRE_PROXY_UPSTREAM"
	envWireProxySubject  = "SHAPER_TEST_WIRE_PROXY_SUBJECT"
)

// wireProxyProcess is a wireProxy running in a process of its own: this test
// binary again, running only TestNATSWireProxyProcess. In the process under
// test the proxy's reads wait for a scheduler that the lane, the client and
// the NATS server keep busy (up to ~20 ms late on a loaded 2-core machine,
// p99 ~1 ms), and it competes with them for the same two Ps. A process of
// its own is idle but for its reads, so its poller wakes as data arrives —
// unless the kernel has no CPU for it: on the same loaded machine it still
// read up to a few ms late (p99 0.2–2 ms), see wireProxy for what that does
// to the stamps.
type wireProxyProcess struct {
	*testProcess
	url string
}

// startWireProxyProcess starts a proxy process in front of upstream that
// records the publishes to subject; Stop returns what it recorded. The
// process is killed on cleanup (and if this one dies).
func startWireProxyProcess(t *testing.T, upstream, subject string) *wireProxyProcess {
	t.Helper()
	tp, addr := startTestProcess(t, "proxy", "TestNATSWireProxyProcess", envWireProxyUpstream+"="+upstream, envWireProxySubject+"="+subject)
	return &wireProxyProcess{testProcess: tp, url: "nats://" + addr}
}

// URL is the nats:// URL clients connect to.
func (p *wireProxyProcess) URL() string { return p.url }

// Stop ends the proxy process and returns the stamps of the publishes it
// saw (sorted) and its read lags (see wireProxy).
func (p *wireProxyProcess) Stop() ([]time.Time, []time.Duration, error) {
	p.stopped = true
	_ = p.stdin.Close()
	var stamps []time.Time
	var lags []time.Duration
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
			return nil, nil, fmt.Errorf("proxy process: %v before its report ended", err)
		}
		kind, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch kind {
		case "S":
			stamps = append(stamps, time.Unix(0, n))
		case "L":
			lags = append(lags, time.Duration(n))
		case "END":
			return stamps, lags, p.cmd.Wait()
		}
	}
}

// TestNATSWireProxyProcess is the body of the proxy process of
// startWireProxyProcess, not a test: without its environment it skips.
// It prints "LISTEN <addr>", forwards until its stdin closes, then prints
// "S <unix ns>" per publish, "L <ns>" per read lag and "END", and exits.
func TestNATSWireProxyProcess(t *testing.T) {
	upstream := os.Getenv(envWireProxyUpstream)
	if upstream == "" {
		t.Skip("the proxy process of startWireProxyProcess")
	}
	p := startWireProxy(t, upstream, os.Getenv(envWireProxySubject))
	w := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(w, "LISTEN %s\n", p.ln.Addr())
	_ = w.Flush()
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, s := range p.Stamps() {
		fmt.Fprintf(w, "S %d\n", s.UnixNano())
	}
	for _, l := range p.ReadLags() {
		fmt.Fprintf(w, "L %d\n", l.Nanoseconds())
	}
	fmt.Fprintln(w, "END")
	_ = w.Flush()
	os.Exit(0) // the report is out; no need for the test framework's epilogue
}
