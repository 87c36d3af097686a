package sinks

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Log writes one JSON line per delivery to an io.Writer: the sink of SPEC §4
// kind log, for trying shaper out and for lanes whose only job is to pace.
// A line looks like
//
//	{"time":"2025-01-02T15:04:05.123456789Z","subject":"callbacks.payments.eu","key":"CALLBACKS:42","stream":"CALLBACKS","seq":42,"delivery":1,"bytes":512}
//
// with time the moment of the write (RFC 3339, UTC, nanoseconds), key the
// idempotency key (SPEC G8), seq the stream sequence, delivery the delivery
// count and bytes the payload length. The payload itself and the headers are
// never written: payloads and headers may carry secrets or personal data, and
// a log is the wrong place for them.
//
// Log is safe for concurrent use: lines are written whole, one at a time. A
// writer that blocks (a full pipe) does not hold Send past its ctx: Send
// returns the ctx error and the write finishes in the background (the line
// may then appear although Send failed, which at-least-once delivery
// allows). A write error is returned as a retryable *shaper.SinkError.
type Log struct {
	w       io.Writer
	turn    chan struct{} // holds one token while a write is in progress
	writers sync.WaitGroup
	gate    gate
}

// NewLog returns a Log writing to w. Close does not close w.
func NewLog(w io.Writer) *Log {
	return &Log{w: w, turn: make(chan struct{}, 1)}
}

// logLine is the JSON shape of one delivery; see [Log].
type logLine struct {
	Time     time.Time `json:"time"`
	Subject  string    `json:"subject"`
	Key      string    `json:"key"`
	Stream   string    `json:"stream"`
	Seq      uint64    `json:"seq"`
	Delivery uint64    `json:"delivery"`
	Bytes    int       `json:"bytes"`
}

// Send writes the line for m. It returns nil once the whole line is
// written, otherwise a retryable *shaper.SinkError wrapping the write error
// or ctx's error.
func (l *Log) Send(ctx context.Context, m *shaper.Message) error {
	if !l.gate.enter() {
		return retryable("log", ErrClosed)
	}
	defer l.gate.leave()
	if err := ctx.Err(); err != nil {
		return retryable("log", err)
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return retryable("log", ctx.Err())
	}
	line, err := json.Marshal(logLine{
		Time:     time.Now().UTC(),
		Subject:  m.Subject,
		Key:      m.Key(),
		Stream:   m.Stream,
		Seq:      m.StreamSeq,
		Delivery: m.NumDelivered,
		Bytes:    len(m.Data),
	})
	if err != nil { // cannot happen for these field types
		<-l.turn
		return retryable("log", err)
	}
	line = append(line, '\n')
	done := make(chan error, 1)
	l.writers.Add(1)
	go func() {
		defer l.writers.Done()
		_, err := l.w.Write(line)
		<-l.turn
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		select {
		case err = <-done: // finished meanwhile: report the write
		default:
			return retryable("log", ctx.Err())
		}
	}
	if err != nil {
		return retryable("log write", err)
	}
	return nil
}

// ReadsPackedHeaders implements drain.PackedHeaderReader: the line holds
// the key only (Message.Key reads packed headers).
func (l *Log) ReadsPackedHeaders() bool { return true }

// Close waits for Sends in progress and for a write still running in the
// background (so it blocks while w blocks). It does not close w. It always
// returns nil; later calls return at once.
func (l *Log) Close() error {
	if l.gate.close() {
		l.writers.Wait()
	}
	return nil
}
