package sinks_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/internal/testserver"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
	"github.com/shaper-dev/shaper/sinks/sinktest"
)

// startJetStream starts an in-process NATS server with JetStream
// (internal/testserver, opts adjusting it), connects to it, and stops both
// on cleanup.
func startJetStream(t *testing.T, opts ...testserver.NATSOption) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv := testserver.NATS(t, opts...)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// createStream creates stream name capturing subjects.
func createStream(t *testing.T, js jetstream.JetStream, name string, subjects ...string) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects})
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	return st
}

func newNATS(t *testing.T, js jetstream.JetStream, subject string) *sinks.NATS {
	t.Helper()
	s := sinks.NewNATS(js, subject)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestNATSConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T) (sinktest.Sink, func() int) {
			_, js := startJetStream(t)
			st := createStream(t, js, "OUT", "out.>")
			return sinks.NewNATS(js, "out.jobs"), func() int {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				info, err := st.Info(ctx)
				if err != nil {
					t.Errorf("stream info: %v", err)
					return -1
				}
				return int(info.State.Msgs)
			}
		},
		NewStalledSink: func(t *testing.T) (sinktest.Sink, func()) {
			// A core subscriber that never answers holds every publish
			// request until its ctx ends.
			nc, js := startJetStream(t)
			sub, err := nc.Subscribe("stall.jobs", func(*nats.Msg) {})
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			return sinks.NewNATS(js, "stall.jobs"), sync.OnceFunc(func() { _ = sub.Unsubscribe() })
		},
	})
}

func TestNATSPublishAndDedupe(t *testing.T) {
	_, js := startJetStream(t)
	st := createStream(t, js, "OUT", "out.>")
	s := newNATS(t, js, "out.jobs")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	withID := testMessage()
	withID.Header = map[string][]string{
		"Nats-Msg-Id":          {"order-7"},
		"Trace-Id":             {"abc"},
		"Tag":                  {"a", "b"},
		"Nats-Expected-Stream": {"CALLBACKS"}, // would fail the publish to OUT
		"nats-rollup":          {"sub"},
	}
	withID.Data = []byte{0, 1, 2, 0xff}
	withID.PackHeader(withID.Header) // as the lane leaves them (drain.PackedHeaderReader)
	withoutID := testMessage()
	withoutID.StreamSeq = 43
	withoutID.Header = map[string][]string{"Trace-Id": {"def"}} // and as a map

	for delivery := uint64(1); delivery <= 3; delivery++ { // redeliveries
		for _, m := range []*shaper.Message{withID, withoutID} {
			m.NumDelivered = delivery
			if err := s.Send(ctx, m); err != nil {
				t.Fatalf("Send (delivery %d): %v", delivery, err)
			}
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("stream holds %d messages after 3 deliveries of 2 jobs, want 2 (de-duplicated)", info.State.Msgs)
	}

	tests := []struct {
		seq     uint64
		data    []byte
		headers map[string][]string // nil value = must be absent
	}{
		{1, withID.Data, map[string][]string{
			"Nats-Msg-Id":          {"order-7"},
			"Trace-Id":             {"abc"},
			"Tag":                  {"a", "b"},
			"Nats-Expected-Stream": nil,
			"nats-rollup":          nil,
		}},
		{2, withoutID.Data, map[string][]string{
			"Nats-Msg-Id": {"CALLBACKS:43"},
			"Trace-Id":    {"def"},
		}},
	}
	for _, tt := range tests {
		raw, err := st.GetMsg(ctx, tt.seq)
		if err != nil {
			t.Fatalf("get %d: %v", tt.seq, err)
		}
		if raw.Subject != "out.jobs" || string(raw.Data) != string(tt.data) {
			t.Errorf("message %d: subject %q data %q, want out.jobs %q", tt.seq, raw.Subject, raw.Data, tt.data)
		}
		for k, v := range tt.headers {
			if got := raw.Header[k]; !slices.Equal(got, v) {
				t.Errorf("message %d: header %s = %q, want %q", tt.seq, k, got, v)
			}
		}
	}
}

func TestNATSErrors(t *testing.T) {
	_, js := startJetStream(t, testserver.WithMaxPayload(1024))
	createStream(t, js, "OUT", "out.>")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("no stream is retryable", func(t *testing.T) {
		err := newNATS(t, js, "nowhere.jobs").Send(ctx, testMessage())
		var se *shaper.SinkError
		if !errors.As(err, &se) || se.Permanent || se.Status != 0 || !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Errorf("Send to a subject without a stream: %v, want a retryable *shaper.SinkError wrapping ErrNoStreamResponse", err)
		}
	})
	t.Run("payload too large is permanent", func(t *testing.T) {
		m := testMessage()
		m.Data = make([]byte, 2048)
		err := newNATS(t, js, "out.jobs").Send(ctx, m)
		if !errors.Is(err, shaper.ErrPermanent) || !errors.Is(err, nats.ErrMaxPayload) {
			t.Errorf("Send of a payload above max_payload: %v, want a permanent error wrapping nats.ErrMaxPayload", err)
		}
	})
}

// TestNATSOwnConnection: the sink publishes on a connection of its own,
// dialed with the caller's options at the first Send but without its
// callbacks, and closes only that one on Close.
func TestNATSOwnConnection(t *testing.T) {
	srv := testserver.NATS(t)
	var mu sync.Mutex
	var events []string
	event := func(what string) func(*nats.Conn) {
		return func(*nats.Conn) {
			mu.Lock()
			events = append(events, what)
			mu.Unlock()
		}
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.Name("caller"),
		nats.ClosedHandler(event("closed")), nats.DisconnectHandler(event("disconnected")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	createStream(t, js, "OUT", "out.>")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	s := sinks.NewNATS(js, "out.jobs")
	var wired []time.Time
	for range 3 {
		start := time.Now()
		wctx := shaper.WithWire(ctx, func(at time.Time, exact bool) {
			if exact {
				// With several publishes under way the write may be
				// another's (natsWire): never exact.
				t.Errorf("the NATS sink reported a publish's write as exact")
			}
			wired = append(wired, at)
		})
		if err := s.Send(wctx, testMessage()); err != nil {
			t.Fatalf("Send: %v", err)
		}
		if len(wired) == 0 || wired[len(wired)-1].Before(start) {
			t.Fatalf("Send reported no write of its publish to the wire (reports %v, Send began %v)", wired, start)
		}
	}
	if len(wired) != 3 {
		t.Errorf("%d wire reports for 3 Sends, want one each", len(wired))
	}
	if n := srv.NumClients(); n != 2 {
		t.Errorf("server has %d clients after the sink's Sends, want 2 (the caller's and the sink's own)", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.NumClients() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := srv.NumClients(); n != 1 {
		t.Errorf("server has %d clients after Close, want 1 (the caller's)", n)
	}
	if !nc.IsConnected() {
		t.Error("Close closed the caller's connection")
	}
	if _, err := js.Publish(ctx, "out.jobs", []byte("still usable")); err != nil {
		t.Errorf("the caller's JetStream after Close: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 0 {
		t.Errorf("the caller's connection callbacks ran for the sink's connection: %v", events)
	}
}
