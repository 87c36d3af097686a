package drain

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shaper-dev/shaper/sources/sourcetest"
)

// limitSpy records the limits a MemoryBudget sets (instead of
// debug.SetMemoryLimit, which is the process's).
type limitSpy struct {
	mu  sync.Mutex
	set []int64
}

func (s *limitSpy) setLimit(v int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set = append(s.set, v)
	return 0
}

func (s *limitSpy) last() (int64, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.set) == 0 {
		return 0, 0
	}
	return s.set[len(s.set)-1], len(s.set)
}

// TestMemoryBudget (issue 15, large payloads; drain/memory.go): the soft
// memory limit is Σ (capacity + max_in_flight) × (largest payload fetched +
// MessageOverhead) + MemoryHeadroom, set only from a share of MemoryEngage
// on. The payload is the one a lane fetched (admission), the capacity the
// one after a reload, and a lane that ended leaves the sum.
func TestMemoryBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spy := &limitSpy{}
		logs := &logRecorder{}
		b := newMemoryBudget(spy.setLimit, slog.New(logs))
		small := laneConfig(1000) // capacity 1000, max_in_flight 8
		big := laneConfig(20)
		big.Bucket.Capacity = 300

		srcA := sourcetest.NewMem(time.Minute)
		a, err := New("a", small, srcA, &recSink{}, WithWaiter(TimerWaiter{}), WithMemoryBudget(b))
		if err != nil {
			t.Fatal(err)
		}
		srcB := sourcetest.NewMem(time.Minute)
		bl, err := New("b", big, srcB, &recSink{}, WithWaiter(TimerWaiter{}), WithMemoryBudget(b))
		if err != nil {
			t.Fatal(err)
		}
		// Two lanes of 256-byte (or no) payloads: far under MemoryEngage.
		if v, n := spy.last(); n != 0 {
			t.Fatalf("a limit of %d set for small lanes, want none", v)
		}

		// Lane b fetches one 512 KiB message: 308 × (512 KiB + 512) + headroom.
		srcB.Publish(1)
		srcB.SetData(0, make([]byte, 512<<10))
		bl.Start()
		time.Sleep(time.Second)
		synctest.Wait()
		shareA := int64(1000+8) * (0 + MessageOverhead)
		shareB := int64(300+8) * (512<<10 + MessageOverhead)
		if v, _ := spy.last(); v != shareA+shareB+MemoryHeadroom {
			t.Fatalf("limit %d after a 512 KiB payload, want %d", v, shareA+shareB+MemoryHeadroom)
		}
		if b.Limit() != shareA+shareB+MemoryHeadroom {
			t.Errorf("Limit() = %d", b.Limit())
		}

		// A reload of b to capacity 200 counts at once.
		big.Bucket.Capacity = 200
		if err := bl.Update(big); err != nil {
			t.Fatal(err)
		}
		shareB = int64(200+8) * (512<<10 + MessageOverhead)
		if v, _ := spy.last(); v != shareA+shareB+MemoryHeadroom {
			t.Errorf("limit %d after capacity 200, want %d", v, shareA+shareB+MemoryHeadroom)
		}

		// b ends: the share left is under MemoryEngage, so no limit.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		bl.Drain(ctx)
		a.Drain(ctx)
		cancel()
		srcA.Close()
		srcB.Close()
		v, sets := spy.last()
		if v != math.MaxInt64 {
			t.Errorf("limit %d after the large lane ended, want none (MaxInt64)", v)
		}
		// Every change is logged (an operator sees a raised limit too).
		if n := logs.count(slog.LevelInfo, "memory limit from what the buckets may hold"); n != sets {
			t.Errorf("%d log lines for %d changes of the limit", n, sets)
		}
	})
}

// TestMemoryBudgetOff: with GOMEMLIMIT set the operator's limit stays, and
// a nil budget is a no-op for the lanes.
func TestMemoryBudgetOff(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "off")
	if b := NewMemoryBudget(nil); b != nil {
		t.Fatal("NewMemoryBudget with GOMEMLIMIT set returned a budget")
	}
	var b *MemoryBudget
	if b.Limit() != math.MaxInt64 {
		t.Error("nil budget reports a limit")
	}
}
