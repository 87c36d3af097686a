package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources"
)

// memoryRow is one row of section 5.
type memoryRow struct {
	name     string
	n        int
	perMsg   float64 // heap bytes per queued message
	total    uint64  // heap bytes in all
	err      error
	fromJS   bool
	ringSize int // bytes of the bucket's ring of pointers
}

// heapAlloc returns HeapAlloc after two collections (the second one frees
// what the first one's finalizers released).
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// memorySynthetic fills a bucket of capacity n with shaper.Message values
// shaped like those sources.JetStream builds (a subject string of its own, a
// header map of one entry, a payload of payloadSize bytes, stream, sequence,
// times), without the JetStream message behind the Acker.
func memorySynthetic(n int) memoryRow {
	r := memoryRow{name: "shaper.Message as the source builds it, Acker nil", n: n, ringSize: 8 * n}
	before := heapAlloc()
	b := shaper.NewBucket(n)
	now := time.Now()
	for i := range n {
		data := make([]byte, payloadSize)
		data[0] = byte(i)
		m := &shaper.Message{
			Subject:      strings.Clone("bench.jobs"),
			Header:       map[string][]string{shaper.MsgIDHeader: {"job-" + strconv.Itoa(i)}},
			Data:         data,
			Stream:       "MEM",
			StreamSeq:    uint64(i + 1),
			NumDelivered: 1,
			Received:     now,
		}
		if _, err := b.Admit(m, now, false, 0, 0); err != nil {
			r.err = err
			return r
		}
	}
	after := heapAlloc()
	runtime.KeepAlive(b)
	r.total = after - before
	r.perMsg = float64(after-before) / float64(n)
	return r
}

// memoryJetStream fills a bucket of capacity st.n with the messages of st,
// fetched through sources.JetStream exactly as a lane fetches them: what a
// full bucket really holds, including nats.go's message behind each Acker.
func (e *natsEnv) memoryJetStream(ctx context.Context, st *stream) memoryRow {
	r := memoryRow{name: "fetched through sources.JetStream (real Acker)", n: st.n, fromJS: true, ringSize: 8 * st.n}
	consumer := e.consumerName("mem")
	defer func() { _ = e.js.DeleteConsumer(context.Background(), st.name, consumer) }()
	before := heapAlloc()
	src, err := sources.NewJetStream(ctx, e.js, sources.JetStreamConfig{
		Stream: st.name, Subjects: []string{st.filter()}, Durable: consumer,
		AckWait: config.DefaultAckWait, MaxAckPending: st.n + config.DefaultMaxInFlight,
	}, nil)
	if err != nil {
		r.err = err
		return r
	}
	b := shaper.NewBucket(st.n)
	deadline := time.Now().Add(time.Minute)
	for b.Len() < st.n {
		if time.Now().After(deadline) {
			r.err = fmt.Errorf("fetched %d of %d", b.Len(), st.n)
			return r
		}
		want := b.Reserve(st.n)
		got := 0
		err := src.Fetch(ctx, want, func(m *shaper.Message) {
			got++
			if _, err := b.Admit(m, time.Now(), true, 0, 0); err != nil && r.err == nil {
				r.err = err
			}
		})
		b.Release(want - got)
		if r.err != nil {
			return r
		}
		if err != nil && b.Len() < st.n {
			r.err = err
			return r
		}
	}
	after := heapAlloc()
	runtime.KeepAlive(b)
	runtime.KeepAlive(src)
	r.total = after - before
	r.perMsg = float64(after-before) / float64(st.n)
	return r
}
