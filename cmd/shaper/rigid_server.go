package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rigidServer is the demo's downstream: a minimal HTTP/1.1 server (keep-alive,
// Content-Length bodies) that judges each request by the kernel's receive
// timestamp of its first byte (SO_TIMESTAMPNS), not by when its handler
// happened to be scheduled. On loopback that timestamp is taken when shaper
// wrote the request, so the judge measures shaper's spacing at the wire, the
// way a remote downstream sees it at its network card, free of the child
// process's own wake-up latency (milliseconds on these virtual machines).
//
// Rule (like nginx limit_req without burst, SPEC §5): a request is rejected
// with 429 when an accepted request arrived less than minGap before or
// after it.
type rigidServer struct {
	minGap time.Duration
	report func(at time.Time, ok bool, key string, published int64)

	mu       sync.Mutex
	accepted []time.Time // recent accepted arrivals, sorted
}

func (s *rigidServer) judge(at time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.accepted), func(i int) bool { return !s.accepted[i].Before(at) })
	if i > 0 && at.Sub(s.accepted[i-1]) < s.minGap {
		return false
	}
	if i < len(s.accepted) && s.accepted[i].Sub(at) < s.minGap {
		return false
	}
	s.accepted = append(s.accepted, time.Time{})
	copy(s.accepted[i+1:], s.accepted[i:])
	s.accepted[i] = at
	if len(s.accepted) > 64 {
		s.accepted = s.accepted[len(s.accepted)-64:]
	}
	return true
}

// listenTimestamped listens with SO_TIMESTAMPNS already on, so accepted
// connections inherit it and the first request of a fresh connection is
// stamped when it arrived, not when the server got round to it.
func listenTimestamped(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

func (s *rigidServer) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go s.conn(c.(*net.TCPConn))
	}
}

// tsReader reads from a TCP connection with recvmsg, keeping the kernel
// receive timestamp of the last read.
type tsReader struct {
	raw interface {
		Read(func(fd uintptr) bool) error
	}
	last time.Time
	oob  []byte
}

func (r *tsReader) Read(p []byte) (int, error) {
	var n, oobn int
	var rerr error
	err := r.raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), p, r.oob, 0)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 {
		return 0, io.EOF
	}
	r.last = time.Now()
	if msgs, err := unix.ParseSocketControlMessage(r.oob[:oobn]); err == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
				sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
				nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
				r.last = time.Unix(sec, nsec)
			}
		}
	}
	return n, nil
}

func (s *rigidServer) conn(c *net.TCPConn) {
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	})
	r := &tsReader{raw: raw, oob: make([]byte, 128)}
	var buf []byte
	chunk := make([]byte, 64<<10)
	var reqStart time.Time
	for {
		// One request: headers up to CRLFCRLF, then Content-Length bytes.
		end := bytes.Index(buf, []byte("\r\n\r\n"))
		if end < 0 {
			n, err := r.Read(chunk)
			if err != nil {
				return
			}
			if len(buf) == 0 {
				reqStart = r.last
			}
			buf = append(buf, chunk[:n]...)
			continue
		}
		head := string(buf[:end])
		length, key := 0, ""
		for _, line := range bytes.Split([]byte(head), []byte("\r\n"))[1:] {
			name, value, ok := bytes.Cut(line, []byte(":"))
			if !ok {
				continue
			}
			switch string(bytes.ToLower(bytes.TrimSpace(name))) {
			case "content-length":
				length, _ = strconv.Atoi(string(bytes.TrimSpace(value)))
			case "idempotency-key":
				key = string(bytes.TrimSpace(value))
			}
		}
		for len(buf) < end+4+length {
			n, err := r.Read(chunk)
			if err != nil {
				return
			}
			buf = append(buf, chunk[:n]...)
		}
		body := buf[end+4 : end+4+length]
		var payload struct {
			Published int64 `json:"published_unix_nano"`
		}
		_ = json.Unmarshal(body, &payload)
		ok := s.judge(reqStart)
		s.report(reqStart, ok, key, payload.Published)
		resp := "HTTP/1.1 204 No Content\r\n\r\n"
		if !ok {
			resp = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\ntoo soon\n"
		}
		if _, err := c.Write([]byte(resp)); err != nil {
			return
		}
		buf = append(buf[:0], buf[end+4+length:]...)
		if len(buf) > 0 {
			reqStart = r.last
		}
	}
}
