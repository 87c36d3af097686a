package drain

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
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

// TestFloorPercent (issue 15; drain/memory.go, the GC floor): GOGC keeps
// the heap goal, live + (live + stacks + globals) × GOGC/100, at no less
// than the floor and near it, and is Go's default 100 once the default goal
// reaches it.
func TestFloorPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		st   gcCycleStats
		want int
	}{
		{gcCycleStats{}, 800},
		{gcCycleStats{live: 1 * mib}, 800}, // 3100 would make the heap minimum 124 MiB
		{gcCycleStats{live: 3 * mib, stacks: mib / 2, globals: mib / 2}, 725},
		{gcCycleStats{live: 3 * mib}, 800}, // the heap minimum, 32 MiB, is the goal
		{gcCycleStats{live: 2 * mib, stacks: mib / 2, globals: mib / 2}, 800},
		{gcCycleStats{live: 10 * mib}, 220},
		{gcCycleStats{live: 4 * mib, stacks: mib / 4, globals: mib / 4}, 623}, // 622.2 rounded up: the goal is not under the floor
		{gcCycleStats{live: 16 * mib}, 100},
		{gcCycleStats{live: 15 * mib, globals: 2 * mib}, 100},
		{gcCycleStats{live: 16*mib - 1}, 101},
		{gcCycleStats{live: 200 * mib}, 100},
		{gcCycleStats{live: 100 << 10}, 800},
	} {
		got := floorPercent(c.st)
		if got != c.want {
			t.Errorf("floorPercent(%+v) = %d, want %d", c.st, got, c.want)
		}
		base := c.st.live + c.st.stacks + c.st.globals
		goal := max(c.st.live+base*int64(got)/100, runtimeHeapMinimum*int64(got)/100) // the runtime's goal
		if goal > GCFloor+base && got > 100 {
			t.Errorf("floorPercent(%+v) = %d: goal %d past the floor", c.st, got, goal)
		}
		if goal < GCFloor {
			t.Errorf("floorPercent(%+v) = %d: goal %d under the floor", c.st, got, goal)
		}
	}
}

// TestGCFloorTuner (drain/memory.go): the tuner sets GOGC from the live
// heap only when it changes, and Stop restores the GOGC before its first
// set and ends the tuning.
func TestGCFloorTuner(t *testing.T) {
	const mib = 1 << 20
	live := int64(2 * mib)
	var set []int
	gogc := 75 // the operator's, say, before the floor
	tu := newGCFloor(func() gcCycleStats { return gcCycleStats{live: live} }, func(p int) int {
		set = append(set, p)
		old := gogc
		gogc = p
		return old
	})
	tu.tune()
	tu.tune()
	live = 40 * mib
	tu.tune()
	if want := []int{800, 100}; !slices.Equal(set, want) {
		t.Fatalf("GOGC set %v, want %v", set, want)
	}
	tu.Stop()
	if gogc != 75 {
		t.Fatalf("GOGC after Stop = %d, want the 75 from before", gogc)
	}
	live = 1 * mib
	if tu.tune() || gogc != 75 {
		t.Fatalf("tune after Stop set GOGC %d", gogc)
	}
	var none *GCFloorTuner
	none.Stop()
	if none.Percent() != 0 {
		t.Fatal("a nil tuner has a percent")
	}
}

// gogcNow reads the GOGC in force (runtime/metrics /gc/gogc:percent).
func gogcNow() int { return int(runtimeMetric("/gc/gogc:percent")) }

func runtimeMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestGCFloorEachCycle (drain/memory.go): with the real runtime, the
// tuner's finalizer sets GOGC after a collection and again after each later
// one: above 100 for this test binary's small heap, 100 while a live
// 48 MiB is held, and what it was once stopped.
func TestGCFloorEachCycle(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: the test needs the default collector")
	}
	before := gogcNow()
	tu := newGCFloor(lastCycle, debug.SetGCPercent)
	tu.arm() // no tune first: the first set comes from a cycle
	defer tu.Stop()
	waitGOGC := func(ok func(int) bool, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(gogcNow()) {
			if time.Now().After(deadline) {
				t.Fatalf("GOGC %d, last cycle %+v: want %s", gogcNow(), lastCycle(), what)
			}
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitGOGC(func(p int) bool { return p > 100 }, "above 100 for a small heap")
	// The runtime's own goal is the floor, not past it (GOGC applies to the
	// stacks and globals too).
	if goal := int64(runtimeMetric("/gc/heap/goal:bytes")); goal < GCFloor*9/10 || goal > GCFloor*11/10 {
		t.Errorf("heap goal %.1f MiB with GOGC %d, last cycle %+v: want the floor, %d MiB", float64(goal)/(1<<20), gogcNow(), lastCycle(), GCFloor>>20)
	}
	hold := make([]byte, 48<<20)
	for i := range hold {
		hold[i] = byte(i)
	}
	waitGOGC(func(p int) bool { return p == 100 }, "100 with 48 MiB live")
	runtime.KeepAlive(hold)
	hold = nil
	waitGOGC(func(p int) bool { return p > 100 }, "above 100 again")
	tu.Stop()
	if p := gogcNow(); p != before {
		t.Fatalf("GOGC after Stop = %d, want %d", p, before)
	}
}

// TestStartGCFloorOnce (drain/memory.go): GOGC is the process's, so a
// second StartGCFloor while one runs starts nothing, and one may start again
// after Stop.
func TestStartGCFloorOnce(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: StartGCFloor keeps it")
	}
	first := StartGCFloor(nil)
	if first == nil || first.Percent() <= 100 {
		t.Fatalf("StartGCFloor = %v, GOGC %d: want a floor above 100 for this small heap", first, first.Percent())
	}
	if second := StartGCFloor(nil); second != nil {
		second.Stop()
		t.Fatal("a second StartGCFloor started while one runs")
	}
	first.Stop()
	again := StartGCFloor(nil)
	if again == nil {
		t.Fatal("StartGCFloor after Stop started nothing")
	}
	again.Stop()
}
