//go:build linux

package sinks_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shaper-dev/shaper/internal/kstamp"
	"github.com/shaper-dev/shaper/shaper/shapertest"
)

// wireProxy is a TCP proxy between NATS clients and a NATS server that
// records what the server receives: for every PUB or HPUB protocol line to
// one subject that a client sends through it, the kernel receive timestamp
// (SO_TIMESTAMPNS, CLOCK_REALTIME) of the TCP segment that carried the
// line's first byte. It measures the wire, not the client: a publish the
// client's writer holds back is stamped when it finally arrives, and
// publishes that arrive in one segment share a stamp.
//
// Each read first peeks at one byte (MSG_PEEK) for the stamp of the segment
// at the head of the receive queue — recvmsg on TCP reports the stamp of the
// last segment it consumed, which for a read that drains several queued
// segments is the newest of them. Still, the stamps are only as good as the
// proxy's promptness: segments that queue up while it is not reading are
// merged by TCP in the receive queue (TcpExtTCPRcvCoalesce), the merged
// segment keeps the newest stamp, and one read takes several of them, so a
// late proxy sees clumps that were not on the wire. ReadLags reports how
// late it read; loSniffer, where permitted, is the reference.
type wireProxy struct {
	t        testing.TB
	ln       net.Listener
	upstream string
	subject  []byte

	mu     sync.Mutex
	stamps []time.Time     // per PUB/HPUB to subject, in arrival order per connection
	lags   []time.Duration // per read: return of the read − stamp of its first segment
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

// startWireProxy listens on a free loopback port and forwards every
// connection to upstream (host:port), recording the publishes to subject.
// It stops on cleanup.
func startWireProxy(t testing.TB, upstream, subject string) *wireProxy {
	t.Helper()
	// A receive buffer far larger than what a late read leaves queued, so
	// that the proxy's own lateness never closes the TCP window and makes the
	// client's kernel send what queued meanwhile as one large segment.
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
			}
		})
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &wireProxy{t: t, ln: ln, upstream: upstream, subject: []byte(subject)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the nats:// URL clients connect to.
func (p *wireProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Stamps returns the receive times of the publishes seen so far, sorted.
func (p *wireProxy) Stamps() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := slices.Clone(p.stamps)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	return s
}

// ReadLags returns, for every read of client data, how long after the
// arrival of its first segment the read returned.
func (p *wireProxy) ReadLags() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lags)
}

func (p *wireProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}

// track registers c to be closed by close; false when the proxy is closed.
func (p *wireProxy) track(c ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns = append(p.conns, c...)
	return true
}

func (p *wireProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			p.t.Errorf("proxy dial %s: %v", p.upstream, err)
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			_ = c.Close()
			_ = up.Close()
			return
		}
		r, err := newStampReader(c.(*net.TCPConn))
		if err != nil {
			p.t.Errorf("proxy: %v", err)
			_ = c.Close()
			_ = up.Close()
			continue
		}
		p.wg.Add(2)
		go func() { // server → client, as it comes
			defer p.wg.Done()
			_, _ = io.Copy(c, up)
			_ = c.Close()
		}()
		go func() { // client → server, stamped
			defer p.wg.Done()
			defer func() { _ = up.Close() }()
			sc := &pubScanner{subject: p.subject}
			buf := make([]byte, 64<<10)
			for {
				n, stamp, err := r.read(buf)
				if n > 0 {
					lag := time.Since(stamp)
					if _, werr := up.Write(buf[:n]); werr != nil {
						return
					}
					var found []time.Time
					sc.feed(buf[:n], stamp, func(at time.Time) { found = append(found, at) })
					p.mu.Lock()
					p.stamps = append(p.stamps, found...)
					p.lags = append(p.lags, lag)
					p.mu.Unlock()
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// stampReader reads a TCP connection and returns with each read the kernel
// receive time of the segment its data starts with (internal/kstamp, with
// quick acks so that this reader's lag does not change how the client
// sends).
type stampReader struct{ r *kstamp.Reader }

func newStampReader(c *net.TCPConn) (*stampReader, error) {
	r, err := kstamp.NewReader(c, kstamp.QuickAck())
	if err != nil {
		return nil, err
	}
	return &stampReader{r: r}, nil
}

// read reads into b. The stamp is the arrival of the first segment read;
// a read the kernel did not stamp is an error (time.Now() with it).
func (s *stampReader) read(b []byte) (int, time.Time, error) {
	n, err := s.r.Read(b)
	if err != nil {
		return 0, time.Time{}, err
	}
	if !s.r.Kernel() {
		return n, time.Now(), errors.New("proxy: no SO_TIMESTAMPNS stamp on a read")
	}
	return n, s.r.Last(), nil
}

// pubScanner follows the client side of the NATS protocol (control lines
// ending in CRLF; PUB and HPUB followed by their payload and CRLF) and
// reports each PUB/HPUB to subject with the stamp of the read that carried
// the first byte of its line.
type pubScanner struct {
	subject   []byte
	line      []byte
	lineStamp time.Time
	skip      int // payload bytes (and CRLF) still to pass over
}

func (s *pubScanner) feed(b []byte, stamp time.Time, found func(time.Time)) {
	for len(b) > 0 {
		if s.skip > 0 {
			k := min(s.skip, len(b))
			s.skip -= k
			b = b[k:]
			continue
		}
		if len(s.line) == 0 {
			s.lineStamp = stamp
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.line = append(s.line, b...)
			return
		}
		s.line = append(s.line, b[:i+1]...)
		b = b[i+1:]
		s.control(s.line, found)
		s.line = s.line[:0]
	}
}

func (s *pubScanner) control(line []byte, found func(time.Time)) {
	f := bytes.Fields(line)
	if len(f) < 3 {
		return
	}
	op := string(bytes.ToUpper(f[0]))
	if op != "PUB" && op != "HPUB" {
		return
	}
	size, err := strconv.Atoi(string(f[len(f)-1]))
	if err != nil || size < 0 {
		return
	}
	s.skip = size + 2
	if bytes.Equal(f[1], s.subject) {
		found(s.lineStamp)
	}
}

// wireStats summarises when publishes reached the wire.
type wireStats struct {
	n        int
	span     time.Duration // first to last
	rate     float64       // (n − 1) / span
	maxGap   time.Duration // longest silence between two publishes
	maxClump int           // most publishes sharing one stamp
}

func statsOf(ts []time.Time) wireStats {
	s := wireStats{n: len(ts)}
	if len(ts) < 2 {
		return s
	}
	s.span = ts[len(ts)-1].Sub(ts[0])
	s.rate = float64(len(ts)-1) / s.span.Seconds()
	clump := 1
	s.maxClump = 1
	for i := 1; i < len(ts); i++ {
		d := ts[i].Sub(ts[i-1])
		s.maxGap = max(s.maxGap, d)
		if d == 0 {
			clump++
			s.maxClump = max(s.maxClump, clump)
		} else {
			clump = 1
		}
	}
	return s
}

// maxInWindow returns the most stamps of ts (sorted) that fit in one closed
// window of length w, and where the first such window starts.
func maxInWindow(ts []time.Time, w time.Duration) (int, time.Time) {
	return shapertest.MaxInClosedWindow(ts, w)
}

// percentile returns the q-quantile (0..1) of d (unsorted; not modified).
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
