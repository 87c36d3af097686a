package shaper

import (
	"errors"
	"testing"
	"time"
)

func TestBucketFIFOAndCapacity(t *testing.T) {
	b := NewBucket(3)
	for i := range 3 {
		if _, err := b.Admit(&Message{StreamSeq: uint64(i)}, t0, false, 10, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Admit(&Message{}, t0, false, 10, 0); !errors.Is(err, ErrBucketFull) {
		t.Fatalf("4th admit: %v, want ErrBucketFull", err)
	}
	for i := range 3 {
		m, empty := b.Pop()
		if m.StreamSeq != uint64(i) || empty != (i == 2) {
			t.Fatalf("pop %d = %d empty=%v", i, m.StreamSeq, empty)
		}
	}
	if m, _ := b.Pop(); m != nil {
		t.Fatal("pop of an empty bucket returned a message")
	}
}

func TestBucketReservations(t *testing.T) {
	b := NewBucket(10)
	if k := b.Reserve(7); k != 7 {
		t.Fatalf("reserve 7 of 10 = %d", k)
	}
	if k := b.Reserve(7); k != 3 {
		t.Fatalf("reserve 7 more = %d, want the 3 left", k)
	}
	// Without a reservation nothing fits: every slot is promised (G6).
	if _, err := b.Admit(&Message{}, t0, false, 10, 0); !errors.Is(err, ErrBucketFull) {
		t.Fatalf("unreserved admit: %v", err)
	}
	for range 4 {
		if _, err := b.Admit(&Message{}, t0, true, 10, 0); err != nil {
			t.Fatal(err)
		}
	}
	b.Release(6)
	if f := b.Free(); f != 6 {
		t.Fatalf("free = %d, want 6", f)
	}
}

func TestBucketMaxWait(t *testing.T) {
	b := NewBucket(100)
	// At 10/s, 15 ahead is a 1.5 s wait: the 16th is admitted, the 17th is not.
	for i := range 16 {
		if _, err := b.Admit(&Message{}, t0, false, 10, 1500*time.Millisecond); err != nil {
			t.Fatalf("admit %d: %v", i, err)
		}
	}
	if _, err := b.Admit(&Message{}, t0, false, 10, 1500*time.Millisecond); !errors.Is(err, ErrMaxWait) {
		t.Fatalf("17th: %v, want ErrMaxWait", err)
	}
	// A paused lane (rate 0) projects an infinite wait.
	if _, err := NewBucket(5).Admit(&Message{}, t0, false, 0, time.Second); !errors.Is(err, ErrMaxWait) {
		t.Fatalf("rate 0: %v, want ErrMaxWait", err)
	}
}

func TestBucketSetCapacityKeepsMessages(t *testing.T) {
	b := NewBucket(4)
	for i := range 3 {
		b.Admit(&Message{StreamSeq: uint64(i)}, t0, false, 10, 0)
	}
	b.Pop() // head moves: the ring wraps on the next admissions
	b.Admit(&Message{StreamSeq: 3}, t0, false, 10, 0)
	b.Admit(&Message{StreamSeq: 4}, t0, false, 10, 0)
	if k := b.Reserve(5); k != 0 {
		t.Fatalf("reserved %d of a full bucket", k)
	}
	b.SetCapacity(2) // smaller than what it holds
	if _, err := b.Admit(&Message{}, t0, false, 10, 0); !errors.Is(err, ErrBucketFull) {
		t.Fatalf("admit over the new capacity: %v", err)
	}
	for want := uint64(1); want <= 4; want++ {
		if m, _ := b.Pop(); m == nil || m.StreamSeq != want {
			t.Fatalf("pop = %v, want seq %d (order kept)", m, want)
		}
	}
	b.SetCapacity(6)
	if k := b.Reserve(10); k != 6 {
		t.Fatalf("reserve after growing = %d, want 6", k)
	}
}

// TestBucketDropHeadWhile: it removes from the head only, stops at the first
// message it keeps, and frees their slots.
func TestBucketDropHeadWhile(t *testing.T) {
	b := NewBucket(5)
	for i := range 5 {
		if _, err := b.Admit(&Message{StreamSeq: uint64(i)}, t0, false, 10, 0); err != nil {
			t.Fatal(err)
		}
	}
	removed, empty := b.DropHeadWhile(func(m *Message) bool { return m.StreamSeq != 2 && m.StreamSeq != 4 })
	if len(removed) != 2 || removed[0].StreamSeq != 0 || removed[1].StreamSeq != 1 || empty {
		t.Fatalf("removed %v (empty %v), want seq 0 and 1 and a bucket that is not empty", removed, empty)
	}
	if m := b.Peek(); m.StreamSeq != 2 || b.Len() != 3 || b.Free() != 2 {
		t.Errorf("head %d, len %d, free %d; want 2, 3, 2", m.StreamSeq, b.Len(), b.Free())
	}
	if _, empty := b.DropHeadWhile(func(*Message) bool { return true }); !empty || b.Len() != 0 {
		t.Error("dropping everything left messages")
	}
}
