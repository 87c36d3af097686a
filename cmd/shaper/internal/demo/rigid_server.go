package demo

import (
	"bytes"
	"encoding/json"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/shaper-dev/shaper/internal/kstamp"
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

func (s *rigidServer) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go s.conn(c.(*net.TCPConn))
	}
}

func (s *rigidServer) conn(c *net.TCPConn) {
	defer c.Close()
	r, err := kstamp.NewReader(c)
	if err != nil {
		return
	}
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
				reqStart = r.Last()
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
			reqStart = r.Last()
		}
	}
}
