package shaper

import (
	"testing"
	"time"
)

// TestBucketFreedThreshold: with SetFreedThreshold(n), a removal signals
// Freed only when it leaves at least n slots free or the bucket empty
// (issue 15: the fetch loop pulls only from the low-water mark on, and woke
// once per departure for nothing); Release always signals.
func TestBucketFreedThreshold(t *testing.T) {
	signalled := func(b *Bucket) bool {
		select {
		case <-b.Freed():
			return true
		default:
			return false
		}
	}
	now := time.Unix(0, 0)
	for _, tc := range []struct {
		name      string
		threshold int
		want      []bool // after each of 5 pops from a full bucket of 5
	}{
		{"default: every removal", 0, []bool{true, true, true, true, true}},
		{"threshold 1", 1, []bool{true, true, true, true, true}},
		{"threshold 3", 3, []bool{false, false, true, true, true}},
		{"threshold above capacity: only when empty", 9, []bool{false, false, false, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBucket(5)
			if tc.threshold > 0 {
				b.SetFreedThreshold(tc.threshold)
			}
			for i := range 5 {
				if _, err := b.Admit(&Message{StreamSeq: uint64(i + 1)}, now, false, 0, 0); err != nil {
					t.Fatal(err)
				}
			}
			signalled(b) // drain any token
			for i, want := range tc.want {
				b.Pop()
				if got := signalled(b); got != want {
					t.Errorf("pop %d (%d free): signalled %v, want %v", i+1, i+1, got, want)
				}
			}
			b.Release(1)
			if !signalled(b) {
				t.Error("Release did not signal")
			}
		})
	}
	// RemoveIf and DropHeadWhile follow the same rule.
	b := NewBucket(5)
	b.SetFreedThreshold(3)
	for i := range 5 {
		b.Admit(&Message{StreamSeq: uint64(i + 1)}, now, false, 0, 0)
	}
	signalled(b)
	if b.DropHeadWhile(func(m *Message) bool { return m.StreamSeq == 1 }); signalled(b) {
		t.Error("DropHeadWhile leaving 1 free signalled")
	}
	if b.RemoveIf(func(m *Message) bool { return m.StreamSeq <= 3 }); !signalled(b) {
		t.Error("RemoveIf leaving 3 free did not signal")
	}
}
