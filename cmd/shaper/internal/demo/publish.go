package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publisher publishes the demo's arrivals: the flash-sale burst, then the
// trickle, and records when each was published.
type publisher struct {
	js jetstream.JetStream

	mu        sync.Mutex
	published []time.Time
	err       error // the first publish error
}

func demoMsg(i int, now time.Time) *nats.Msg {
	data, _ := json.Marshal(map[string]any{"id": i, "published_unix_nano": now.UnixNano()})
	msg := &nats.Msg{Subject: fmt.Sprintf("demo.payments.%d", i), Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, demoKey(i))
	return msg
}

// demoKey is message i's Nats-Msg-Id, the key the downstream counts.
func demoKey(i int) string { return fmt.Sprintf("order-%06d", i) }

func (p *publisher) note(at time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil && p.err == nil {
		p.err = err
	}
	if !at.IsZero() {
		p.published = append(p.published, at)
	}
}

// snapshot returns a copy of the publish times and the first error.
func (p *publisher) snapshot() ([]time.Time, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.published...), p.err
}

func (p *publisher) run(ctx context.Context, o Options, start time.Time) {
	// The flash sale: the burst as fast as the server takes it.
	futures := make([]jetstream.PubAckFuture, 0, o.Burst)
	for i := range o.Burst {
		f, err := p.js.PublishMsgAsync(demoMsg(i, time.Now()))
		p.note(time.Now(), err)
		if err == nil {
			futures = append(futures, f)
		}
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			p.note(time.Time{}, err)
		}
	}
	// Then the trickle.
	if o.TrickleRate > 0 {
		every := time.Second / time.Duration(o.TrickleRate)
		n := int(float64(o.TrickleRate) * o.TrickleFor.Seconds())
		for i := range n {
			time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
			if ctx.Err() != nil { // --timeout, or the demo was stopped
				return
			}
			now := time.Now()
			_, err := p.js.PublishMsg(ctx, demoMsg(o.Burst+i, now))
			p.note(now, err)
		}
	}
}
