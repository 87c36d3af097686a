package shaper

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var testSeed uint64 // set by hand to replay a seed printed by TestFairProperty

func keyMsg(key string, seq uint64) *Message {
	return &Message{Subject: "jobs." + key, StreamSeq: seq, Header: map[string][]string{"Tenant": {key}}}
}

func tenant(m *Message) string {
	if v := m.Header["Tenant"]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func popKeys(b *Bucket) string {
	s := ""
	for {
		m, _ := b.Pop()
		if m == nil {
			return s
		}
		s += fmt.Sprintf("%s%d ", tenant(m), m.StreamSeq)
	}
}

// TestFairRoundRobin: one message per key per round, order kept within a
// key, a new key joins at the end of the round.
func TestFairRoundRobin(t *testing.T) {
	b := NewFairBucket(100, tenant)
	for _, m := range []*Message{keyMsg("A", 1), keyMsg("A", 2), keyMsg("A", 3), keyMsg("B", 4), keyMsg("A", 5), keyMsg("C", 6), keyMsg("C", 7)} {
		if _, err := b.Admit(m, t0, false, 10, 0); err != nil {
			t.Fatal(err)
		}
	}
	if k := b.ActiveKeys(); k != 3 {
		t.Fatalf("active keys %d, want 3", k)
	}
	if got, want := popKeys(b), "A1 B4 C6 A2 C7 A3 A5 "; got != want {
		t.Fatalf("departures %q, want %q", got, want)
	}
	// A FIFO bucket keeps the order of admission.
	f := NewBucket(100)
	for _, m := range []*Message{keyMsg("A", 1), keyMsg("A", 2), keyMsg("B", 3)} {
		f.Admit(m, t0, false, 10, 0)
	}
	if got := popKeys(f); got != "A1 A2 B3 " {
		t.Fatalf("FIFO departures %q", got)
	}
}

// TestFairShare: a key alone may fill the bucket; while others wait it is
// refused past ceil(capacity / keys), and the others are admitted.
func TestFairShare(t *testing.T) {
	for _, c := range []struct{ capacity, keys, want int }{
		{6, 0, 6}, {6, 1, 6}, {6, 2, 3}, {6, 3, 2}, {7, 2, 4}, {6000, 3, 2000}, {2, 5, 1},
	} {
		if got := FairShare(c.capacity, c.keys); got != c.want {
			t.Errorf("FairShare(%d, %d) = %d, want %d", c.capacity, c.keys, got, c.want)
		}
	}
	b := NewFairBucket(6, tenant)
	for i := range 4 {
		if _, err := b.Admit(keyMsg("A", uint64(i)), t0, false, 10, 0); err != nil {
			t.Fatalf("A alone, admit %d: %v", i, err)
		}
	}
	if _, err := b.Admit(keyMsg("B", 10), t0, false, 10, 0); err != nil {
		t.Fatalf("B: %v", err)
	}
	_, err := b.Admit(keyMsg("A", 11), t0, false, 10, 0)
	if !errors.Is(err, ErrFairShare) || !errors.Is(err, ErrBucketFull) {
		t.Fatalf("A over its share of 3 while B waits: %v, want ErrFairShare (an ErrBucketFull)", err)
	}
	if _, err := b.Admit(keyMsg("B", 12), t0, false, 10, 0); err != nil {
		t.Fatalf("B under its share: %v", err)
	}
	if _, err := b.Admit(keyMsg("C", 13), t0, false, 10, 0); !errors.Is(err, ErrBucketFull) || errors.Is(err, ErrFairShare) {
		t.Fatalf("full bucket: %v, want ErrBucketFull", err)
	}
	// Reserved slots (overflow block) are always admitted.
	b2 := NewFairBucket(4, tenant)
	b2.Reserve(4)
	b2.Admit(keyMsg("B", 1), t0, true, 10, 0)
	for i := range 3 {
		if _, err := b2.Admit(keyMsg("A", uint64(i)), t0, true, 10, 0); err != nil {
			t.Fatalf("reserved admit: %v", err)
		}
	}
	// A FIFO bucket has no share: one "key" fills it.
	f := NewBucket(3)
	for i := range 3 {
		if _, err := f.Admit(keyMsg("A", uint64(i)), t0, false, 10, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFairMaxWait: the projected wait counts what departs before the
// message under round robin, not the whole bucket.
func TestFairMaxWait(t *testing.T) {
	b := NewFairBucket(200, tenant)
	for i := range 50 {
		b.Admit(keyMsg("A", uint64(i)), t0, false, 10, 0)
	}
	// At 10/s, B's first message has A's next one ahead: 0.1 s.
	if _, err := b.Admit(keyMsg("B", 100), t0, false, 10, 200*time.Millisecond); err != nil {
		t.Fatalf("B behind one of A: %v", err)
	}
	// B's second: its own and two of A (A, B, A): 0.3 s; the third would
	// have 2 + 3 ahead: 0.5 s.
	if _, err := b.Admit(keyMsg("B", 101), t0, false, 10, 300*time.Millisecond); err != nil {
		t.Fatalf("B's second: %v", err)
	}
	if _, err := b.Admit(keyMsg("B", 102), t0, false, 10, 300*time.Millisecond); !errors.Is(err, ErrMaxWait) {
		t.Fatalf("B's third: %v, want ErrMaxWait", err)
	}
	if _, err := b.Admit(keyMsg("A", 103), t0, false, 10, 5*time.Second); !errors.Is(err, ErrMaxWait) {
		t.Fatalf("A's 51st (50 + 2 ahead at 10/s): %v, want ErrMaxWait", err)
	}
}

// TestFairDropHeadWhile: the head is the next message to depart; dropping
// it does not use the key's turn.
func TestFairDropHeadWhile(t *testing.T) {
	b := NewFairBucket(100, tenant)
	for _, m := range []*Message{keyMsg("A", 1), keyMsg("A", 2), keyMsg("A", 3), keyMsg("B", 4), keyMsg("B", 5)} {
		b.Admit(m, t0, false, 10, 0)
	}
	b.Pop() // A1; B's turn
	removed, empty := b.DropHeadWhile(func(m *Message) bool { return m.StreamSeq == 4 })
	if len(removed) != 1 || removed[0].StreamSeq != 4 || empty {
		t.Fatalf("removed %v", removed)
	}
	if m := b.Peek(); m.StreamSeq != 5 {
		t.Fatalf("head after the drop %d, want B5 (B keeps its turn)", m.StreamSeq)
	}
	if got := popKeys(b); got != "B5 A2 A3 " {
		t.Fatalf("departures %q", got)
	}
}

// TestFairRemoveIf: removed in admission order; the round and the order
// within keys survive; a key emptied leaves the round.
func TestFairRemoveIf(t *testing.T) {
	b := NewFairBucket(100, tenant)
	for _, m := range []*Message{keyMsg("A", 1), keyMsg("B", 2), keyMsg("A", 3), keyMsg("C", 4), keyMsg("B", 5), keyMsg("A", 6)} {
		b.Admit(m, t0, false, 10, 0)
	}
	b.Pop() // A1; B's turn
	removed, _ := b.RemoveIf(func(m *Message) bool { return tenant(m) == "B" || m.StreamSeq == 3 })
	if len(removed) != 3 || removed[0].StreamSeq != 2 || removed[1].StreamSeq != 3 || removed[2].StreamSeq != 5 {
		t.Fatalf("removed %v, want seq 2, 3, 5", removed)
	}
	if b.Len() != 2 || b.ActiveKeys() != 2 || b.Free() != 98 {
		t.Fatalf("len %d keys %d free %d", b.Len(), b.ActiveKeys(), b.Free())
	}
	if got := popKeys(b); got != "C4 A6 " {
		t.Fatalf("departures %q, want C (next after B) then A", got)
	}
}

// TestFairClass: the burst's key is "top", a key with one waiting "rest".
func TestFairClass(t *testing.T) {
	b := NewFairBucket(100, tenant)
	for i := range 3 {
		b.Admit(keyMsg("A", uint64(i)), t0, false, 10, 0)
	}
	b.Admit(keyMsg("B", 9), t0, false, 10, 0)
	var got []string
	for m, _ := b.Pop(); m != nil; m, _ = b.Pop() {
		got = append(got, tenant(m)+":"+m.FairClass())
	}
	want := "[A:top B:rest A:top A:rest]" // the last A is alone with 1
	if fmt.Sprint(got) != want {
		t.Fatalf("classes %v, want %s", got, want)
	}
	f := NewBucket(5)
	f.Admit(keyMsg("A", 1), t0, false, 10, 0)
	if m, _ := f.Pop(); m.FairClass() != "" && f.Fair() {
		t.Fatal("a FIFO bucket recorded a class")
	}
}

func TestFairKeyFunc(t *testing.T) {
	m := &Message{Subject: "orders.acme.paid", Header: map[string][]string{"Tenant": {"t1", "t2"}}}
	for _, c := range []struct{ spec, want string }{
		{"subject:0", "orders"}, {"subject:1", "acme"}, {"subject:2", "paid"}, {"subject:3", ""},
		{"Tenant", "t1"}, {"tenant", ""}, {"X-Other", ""},
	} {
		f, err := FairKeyFunc(c.spec)
		if err != nil {
			t.Fatalf("%q: %v", c.spec, err)
		}
		if got := f(m); got != c.want {
			t.Errorf("%q: key %q, want %q", c.spec, got, c.want)
		}
	}
	if f, err := FairKeyFunc(""); f != nil || err != nil {
		t.Errorf(`"": %v %v, want nil, nil (one FIFO)`, f != nil, err)
	}
	for _, bad := range []string{"subject:", "subject:-1", "subject:x", "subject:01", "Bad Header", "a:b", "ü"} {
		if _, err := FairKeyFunc(bad); !errors.Is(err, ErrFairKey) {
			t.Errorf("%q: %v, want ErrFairKey", bad, err)
		}
	}
}

// TestFairProperty runs random admissions, departures, head drops and
// sweeps and checks, after each step: depth and keys add up; order is kept
// within each key (G3 per key); and while a key waits, no other key departs
// twice between two of its departures (round robin).
func TestFairProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if testSeed != 0 {
		seed = testSeed
	}
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for run := range 200 {
		b := NewFairBucket(1+r.IntN(60), tenant)
		nkeys := 1 + r.IntN(6)
		held := map[string]int{}
		last := map[string]uint64{}
		since := map[string]map[string]int{} // key -> departures of each other key since its last one
		var seq uint64
		for step := range 400 {
			switch op := r.IntN(10); {
			case op < 5:
				seq++
				k := string(rune('A' + r.IntN(nkeys)))
				if _, err := b.Admit(keyMsg(k, seq), t0, false, 10, 0); err == nil {
					if held[k] == 0 {
						since[k] = map[string]int{}
					}
					held[k]++
				}
			case op < 8:
				m, _ := b.Pop()
				if m == nil {
					continue
				}
				k := tenant(m)
				if m.StreamSeq <= last[k] {
					t.Fatalf("seed %d run %d step %d: key %s departed %d after %d", seed, run, step, k, m.StreamSeq, last[k])
				}
				last[k] = m.StreamSeq
				held[k]--
				since[k] = map[string]int{}
				for o := range held {
					if o != k && held[o] > 0 {
						if since[o][k]++; since[o][k] > 1 {
							t.Fatalf("seed %d run %d step %d: %s departed twice while %s waited", seed, run, step, k, o)
						}
					}
				}
			case op < 9:
				drop := r.IntN(3)
				removed, _ := b.DropHeadWhile(func(*Message) bool { drop--; return drop >= 0 })
				for _, m := range removed {
					held[tenant(m)]--
					last[tenant(m)] = m.StreamSeq
				}
			default:
				mod := uint64(2 + r.IntN(5))
				removed, _ := b.RemoveIf(func(m *Message) bool { return m.StreamSeq%mod == 0 })
				for i, m := range removed {
					held[tenant(m)]--
					if i > 0 && m.StreamSeq <= removed[i-1].StreamSeq {
						t.Fatalf("seed %d: RemoveIf not in admission order", seed)
					}
				}
			}
			n, keys := 0, 0
			for _, h := range held {
				n += h
				if h > 0 {
					keys++
				}
			}
			if b.Len() != n || b.ActiveKeys() != keys {
				t.Fatalf("seed %d run %d step %d: len %d keys %d, want %d %d", seed, run, step, b.Len(), b.ActiveKeys(), n, keys)
			}
		}
	}
}
