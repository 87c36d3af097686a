package sinks_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
	"github.com/shaper-dev/shaper/sinks/sinktest"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// stalledWriter blocks every Write until release.
type stalledWriter struct{ release chan struct{} }

func (w stalledWriter) Write(p []byte) (int, error) {
	<-w.release
	return len(p), nil
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestLogConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T) (sinktest.Sink, func() int) {
			var buf lockedBuffer
			return sinks.NewLog(&buf), func() int { return strings.Count(buf.String(), "\n") }
		},
		NewStalledSink: func(t *testing.T) (sinktest.Sink, func()) {
			w := stalledWriter{release: make(chan struct{})}
			return sinks.NewLog(w), sync.OnceFunc(func() { close(w.release) })
		},
	})
}

func TestLogLine(t *testing.T) {
	var buf lockedBuffer
	l := sinks.NewLog(&buf)
	t.Cleanup(func() { _ = l.Close() })
	m := testMessage()
	m.Data = []byte(`{"card":"4111111111111111"}`)
	m.Header = map[string][]string{"Nats-Msg-Id": {"order-7"}, "Authorization": {"Bearer s3cret"}}
	m.NumDelivered = 2
	before := time.Now().UTC()
	if err := send(t, l, m); err != nil {
		t.Fatalf("Send: %v", err)
	}
	out := buf.String()
	if strings.Contains(out, "4111") || strings.Contains(out, "s3cret") {
		t.Errorf("log line %q contains the payload or a header value", out)
	}
	if !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 {
		t.Fatalf("output %q is not exactly one line", out)
	}
	var line map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&line); err != nil {
		t.Fatalf("line %q is not JSON: %v", out, err)
	}
	want := map[string]string{
		"subject": "callbacks.payments.eu", "key": "order-7", "stream": "CALLBACKS",
		"seq": "42", "delivery": "2", "bytes": "27",
	}
	for k, v := range want {
		got, _ := line[k].(string)
		if n, ok := line[k].(json.Number); ok {
			got = n.String()
		}
		if got != v {
			t.Errorf("field %s = %v, want %s", k, line[k], v)
		}
	}
	if len(line) != len(want)+1 {
		t.Errorf("line has fields %v, want exactly time and %v", line, want)
	}
	ts, err := time.Parse(time.RFC3339Nano, line["time"].(string))
	if err != nil || ts.Before(before) || ts.After(time.Now()) || ts.Location() != time.UTC {
		t.Errorf("time %v (%v): want the UTC moment of the write", line["time"], err)
	}
}

func TestLogConcurrentLinesWhole(t *testing.T) {
	var buf lockedBuffer
	l := sinks.NewLog(&buf)
	t.Cleanup(func() { _ = l.Close() })
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for range 50 {
				if err := send(t, l, testMessage()); err != nil {
					t.Errorf("Send: %v", err)
				}
			}
		})
	}
	wg.Wait()
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	n := 0
	for sc.Scan() {
		n++
		if !json.Valid(sc.Bytes()) {
			t.Fatalf("line %d is not JSON: %q", n, sc.Text())
		}
	}
	if n != 1000 {
		t.Errorf("%d lines, want 1000", n)
	}
}

func TestLogWriteError(t *testing.T) {
	cause := errors.New("disk full")
	l := sinks.NewLog(failingWriter{cause})
	t.Cleanup(func() { _ = l.Close() })
	err := send(t, l, testMessage())
	var se *shaper.SinkError
	if !errors.As(err, &se) || se.Permanent || se.Status != 0 || !errors.Is(err, cause) {
		t.Errorf("Send with a failing writer: %v, want a retryable *shaper.SinkError wrapping %v", err, cause)
	}
}
