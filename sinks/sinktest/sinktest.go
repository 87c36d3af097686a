// Package sinktest is the conformance suite every sink passes: the contract
// of the worker's Sink interface (see package sinks) written as tests. A
// sink's own _test.go calls [Run] with a [Harness] that builds the sink
// against a real downstream the test controls (an httptest.Server, an
// in-process NATS server, a buffer).
//
// Run the suite under -race: one of its checks calls Send from many
// goroutines at once.
package sinktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// Sink is the interface under test; it has the method set of the worker's
// Sink interface.
type Sink interface {
	Send(ctx context.Context, m *shaper.Message) error
	Close() error
}

// Harness builds the sinks the suite tests. Both functions register with
// t.Cleanup whatever their downstream needs torn down (servers,
// connections); those cleanups run after the suite's own, which release
// stalled downstreams and close the sinks.
type Harness struct {
	// NewSink returns a sink whose downstream accepts every message, and a
	// function reporting how many messages the downstream has received so
	// far (each successful Send must have raised it by one by the time Send
	// returns). Required.
	NewSink func(t *testing.T) (s Sink, received func() int)
	// NewStalledSink returns a sink whose downstream accepts the request
	// but never completes a delivery until release is called, so Send can
	// only end by its ctx. release must be safe to call once, after which
	// held calls may complete. Required.
	NewStalledSink func(t *testing.T) (s Sink, release func())
}

// Deadline margins of the suite.
const (
	// StallTimeout is the per-task timeout given to a Send on a stalled
	// downstream.
	StallTimeout = 200 * time.Millisecond
	// Grace is how long after its ctx ended a Send may still take to return.
	Grace = time.Second
)

// Run runs the conformance suite as subtests of t:
//
//   - Success: Send returns nil and the downstream received the message.
//   - CancelledContext: with a ctx already cancelled, Send returns within
//     [Grace] a retryable *shaper.SinkError with context.Canceled or Status
//     0, and the downstream receives nothing.
//   - Deadline: on a stalled downstream, Send returns within Grace of the
//     ctx deadline a retryable *shaper.SinkError for which errors.Is(err,
//     context.DeadlineExceeded) holds or whose Status is 0.
//   - Concurrent: 16 goroutines × 25 Sends all succeed and all arrive.
//   - MessageUnchanged: Send leaves the message it is given as it was.
//   - Close: Close returns nil twice; a Send after Close fails with a
//     retryable *shaper.SinkError (the message goes back for redelivery,
//     never to the dead letter).
//
// Run is longer than 80 lines on purpose: it is the list of the contract's
// subtests, each a few lines, read top to bottom as the contract above.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.NewSink == nil || h.NewStalledSink == nil {
		t.Fatal("sinktest: Harness.NewSink and Harness.NewStalledSink are required")
	}
	var seq atomic.Uint64 // unique keys across the suite, so no downstream de-duplicates
	next := func() *shaper.Message { return message(seq.Add(1)) }
	newSink := func(t *testing.T) (Sink, func() int) {
		t.Helper()
		s, received := h.NewSink(t)
		t.Cleanup(func() { _ = s.Close() })
		return s, received
	}

	t.Run("Success", func(t *testing.T) {
		s, received := newSink(t)
		before := received()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Send(ctx, next()); err != nil {
			t.Fatalf("Send to a healthy downstream: %v", err)
		}
		if got := received() - before; got != 1 {
			t.Errorf("downstream received %d messages after one successful Send, want 1", got)
		}
	})

	t.Run("CancelledContext", func(t *testing.T) {
		s, received := newSink(t)
		before := received()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		err := s.Send(ctx, next())
		elapsed := time.Since(start)
		se := checkRetryable(t, err)
		if se != nil && !errors.Is(err, context.Canceled) && se.Status != 0 {
			t.Errorf("Send with a cancelled ctx: got %v (status %d), want context.Canceled or status 0", err, se.Status)
		}
		if elapsed > Grace {
			t.Errorf("Send with a cancelled ctx took %v, want at most %v", elapsed, Grace)
		}
		if got := received() - before; got != 0 {
			t.Errorf("downstream received %d messages from a Send with a cancelled ctx, want 0", got)
		}
	})

	t.Run("Deadline", func(t *testing.T) {
		s, release := h.NewStalledSink(t)
		t.Cleanup(func() {
			release()
			_ = s.Close()
		})
		ctx, cancel := context.WithTimeout(context.Background(), StallTimeout)
		defer cancel()
		deadline, _ := ctx.Deadline()
		err := s.Send(ctx, next())
		late := time.Since(deadline)
		se := checkRetryable(t, err)
		if se != nil && !errors.Is(err, context.DeadlineExceeded) && se.Status != 0 {
			t.Errorf("Send past its deadline: got %v (status %d), want context.DeadlineExceeded or status 0", err, se.Status)
		}
		if late > Grace {
			t.Errorf("Send returned %v after its deadline, want at most %v", late, Grace)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		const workers, each = 16, 25
		s, received := newSink(t)
		before := received()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, workers*each)
		for range workers {
			wg.Go(func() {
				for range each {
					if err := s.Send(ctx, next()); err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent Send: %v", err)
		}
		if got := received() - before; got != workers*each {
			t.Errorf("downstream received %d messages after %d successful Sends", got, workers*each)
		}
	})

	t.Run("MessageUnchanged", func(t *testing.T) {
		s, _ := newSink(t)
		m := next()
		m.Header[shaper.MsgIDHeader] = []string{fmt.Sprintf("sinktest-%d", m.StreamSeq)}
		m.Header["Nats-Expected-Stream"] = []string{"ELSEWHERE"}
		want := clone(m)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Send(ctx, m); err != nil {
			t.Fatalf("Send: %v", err)
		}
		if !reflect.DeepEqual(m, want) {
			t.Errorf("Send modified the message:\n got %+v\nwant %+v", m, want)
		}
	})

	t.Run("Close", func(t *testing.T) {
		s, _ := newSink(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Send(ctx, next()); err != nil {
			t.Fatalf("Send before Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("first Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		checkRetryable(t, s.Send(ctx, next()))
	})
}

// checkRetryable reports an error unless err is a retryable
// *shaper.SinkError, which it returns (nil when it is not one).
func checkRetryable(t *testing.T, err error) *shaper.SinkError {
	t.Helper()
	var se *shaper.SinkError
	switch {
	case err == nil:
		t.Error("Send returned nil, want an error")
		return nil
	case !errors.As(err, &se):
		t.Errorf("Send returned %v (%T), want a *shaper.SinkError", err, err)
		return nil
	case se.Permanent || errors.Is(err, shaper.ErrPermanent):
		t.Errorf("Send returned a permanent error %v, want a retryable one", err)
	}
	return se
}

// message returns a distinct message numbered n.
func message(n uint64) *shaper.Message {
	return &shaper.Message{
		Subject: "sinktest.jobs",
		Header: map[string][]string{
			"Trace-Id": {fmt.Sprintf("trace-%d", n)},
			"Tag":      {"a", "b"},
		},
		Data:         fmt.Appendf(nil, `{"n":%d}`, n),
		Stream:       "SINKTEST",
		StreamSeq:    n,
		NumDelivered: 1,
		Received:     time.Unix(1700000000, 0),
		Admitted:     time.Unix(1700000000, 1),
	}
}

// clone returns a deep copy of m.
func clone(m *shaper.Message) *shaper.Message {
	c := *m
	c.Header = maps.Clone(m.Header)
	for k, v := range c.Header {
		c.Header[k] = slices.Clone(v)
	}
	c.Data = bytes.Clone(m.Data)
	return &c
}
