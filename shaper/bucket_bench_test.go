package shaper

import (
	"strconv"
	"testing"
)

// BenchmarkBucketAdmitPop is one admission and one departure at a depth of
// 1,000, FIFO (keys 0) or fair between 100 keys.
func BenchmarkBucketAdmitPop(b *testing.B) {
	for _, keys := range []int{0, 100} {
		b.Run("keys="+strconv.Itoa(keys), func(b *testing.B) {
			var keyOf func(*Message) string
			msgs := make([]*Message, 1024)
			for i := range msgs {
				msgs[i] = &Message{Subject: strconv.Itoa(i % max(1, keys))}
			}
			if keys > 0 {
				keyOf = func(m *Message) string { return m.Subject }
			}
			bk := NewFairBucket(2000, keyOf)
			for i := range 1000 {
				bk.Admit(msgs[i%len(msgs)], t0, false, 10, 0)
			}
			b.ResetTimer()
			for i := range b.N {
				bk.Admit(msgs[i%len(msgs)], t0, false, 10, 0)
				bk.Pop()
			}
		})
	}
}
