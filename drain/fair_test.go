package drain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shaper-dev/shaper/shaper"
)

// TestLaneFairKeys: SPEC §3 Fairness on the fake clock. Key A publishes
// 5,000 at once and keys B and C 2/s each, on a lane at 50/s with
// bucket.fair_key Tenant: B and C leave within a round (p99 queue wait well
// under 1 s), A gets the rest of the rate, the order within each key is
// kept, no 1 s window holds more than 50 (G1), and the fair metrics count
// B's and C's departures as "rest".
func TestLaneFairKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recSink{behave: func(call) (time.Duration, error) { return 0, nil }}
		cfg := laneConfig(50)
		cfg.Bucket.Capacity = 6000
		cfg.Bucket.FairKey = "Tenant"
		cfg.Rate.Warmup.ColdFactor = 1
		h := newHarness(t, cfg, sink)
		published := map[string]time.Time{} // msg id -> publish instant
		next := 0
		pub := func(key string, n int) {
			h.src.PublishHeaders(slices.Repeat([]map[string][]string{{"Tenant": {key}}}, n)...)
			for range n {
				published[fmt.Sprintf("msg-%d", next)] = time.Now()
				next++
			}
		}
		pub("A", 5000)
		start := time.Now()
		h.lane.Start()
		for i := range 40 { // 20 s of B and C at 2/s each
			pub("B", 1)
			pub("C", 1)
			if i == 20 {
				if k := testutil.ToFloat64(h.m.FairActiveKeys); k < 1 {
					t.Errorf("shaper_fair_active_keys = %v mid-run, want ≥ 1", k)
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		calls := sink.snapshot()
		counts := map[string]uint64{}
		mfs, _ := h.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "shaper_fair_queue_wait_seconds" {
				continue
			}
			for _, s := range mf.GetMetric() {
				for _, lp := range s.GetLabel() {
					if lp.GetName() == "class" {
						counts[lp.GetValue()] = s.GetHistogram().GetSampleCount()
					}
				}
			}
		}
		h.stop(100 * time.Millisecond)

		var waits []time.Duration
		last := map[string]int{}
		perKey := map[string]int{}
		for _, c := range calls {
			key := c.header["Tenant"][0]
			id, _ := strconv.Atoi(strings.TrimPrefix(c.id, "msg-"))
			if id <= last[key] && perKey[key] > 0 {
				t.Fatalf("key %s: %s departed after msg-%d (order within a key, G3)", key, c.id, last[key])
			}
			last[key] = id
			perKey[key]++
			if key != "A" {
				waits = append(waits, c.at.Sub(published[c.id]))
			}
		}
		slices.Sort(waits)
		if len(waits) != 80 {
			t.Fatalf("%d departures of B and C, want 80", len(waits))
		}
		if p99 := waits[len(waits)*99/100]; p99 >= time.Second || waits[len(waits)-1] > 100*time.Millisecond {
			t.Errorf("B and C queue wait p99 %v, max %v; want under 1 s (within a round: ≤ 100 ms)", p99, waits[len(waits)-1])
		}
		// 21 s at 50/s is 1,050 departures: A has all of them but B's and C's.
		if a := perKey["A"]; a < 1050-80-2 || a > 1050-80+2 {
			t.Errorf("A departed %d times in 21 s, want the rest of 50/s (≈ %d)", a, 1050-80)
		}
		at := times(calls)
		for i := range at {
			j, _ := slices.BinarySearchFunc(at, at[i].Add(time.Second), func(x, y time.Time) int { return x.Compare(y) })
			if j-i > 50 {
				t.Fatalf("%d departures in the 1 s from %v, want ≤ 50 (G1)", j-i, at[i].Sub(start))
			}
		}
		// A's first departures may find it holding one message (the fetch
		// is still filling the bucket): "rest" then.
		if top, rest := counts[shaper.FairClassTop], counts[shaper.FairClassRest]; top+rest != uint64(len(calls)) ||
			rest < 80 || rest > 82 {
			t.Errorf("fair queue waits by class %v, want rest 80 (B, C; up to 2 of A's first) and top the rest of %d", counts, len(calls))
		}
	})
}
