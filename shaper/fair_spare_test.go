package shaper

import "testing"

// TestFairQueueRefillReusesTheQueue: a FIFO bucket that empties and refills
// (a lane at full speed) reuses the queue and slice that emptied (spare):
// no allocation per refill (issue 15, throughput).
func TestFairQueueRefillReusesTheQueue(t *testing.T) {
	f := newFairQueue(false)
	msgs := make([]*Message, 64)
	for i := range msgs {
		msgs[i] = &Message{}
	}
	cycle := func() {
		for _, m := range msgs {
			f.push("", m)
		}
		for range msgs {
			f.pop(true)
		}
	}
	cycle() // the first one grows the slice
	if a := testing.AllocsPerRun(100, cycle); a != 0 {
		t.Errorf("%.1f allocations per refill of 64 messages, want 0", a)
	}
}

// TestFairQueueKeepsNoDepartedMessage: neither the spare queue nor a
// compacted one holds a message that left (it would stay reachable: a
// memory leak of up to the bucket's capacity).
func TestFairQueueKeepsNoDepartedMessage(t *testing.T) {
	f := newFairQueue(true)
	for range 100 {
		f.push("a", &Message{})
	}
	for range 60 { // compacts the front at least once
		f.pop(true)
	}
	q := f.queue("a")
	for i, e := range q.items[len(q.items):cap(q.items)] {
		if e.m != nil {
			t.Fatalf("compacted queue: entry %d past the end still holds a message", len(q.items)+i)
		}
	}
	for range 40 {
		f.pop(true)
	}
	if f.spare == nil {
		t.Fatal("no spare queue after the only key emptied")
	}
	for i, e := range f.spare.items[:cap(f.spare.items)] {
		if e.m != nil {
			t.Fatalf("spare queue: entry %d still holds a message", i)
		}
	}
	spare := f.spare
	f.push("b", &Message{})
	if f.queue("b") != spare || f.spare != nil {
		t.Error("a new key did not take the spare queue")
	}
}
