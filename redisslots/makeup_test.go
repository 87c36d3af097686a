package redisslots

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// The make-up of slots dropped late (redisslots.lua, ARGV[9]–[11];
// docs/scaling.md "Late wake-ups"), driven call by call against a real
// redis-server: the replicas reserve round-robin far ahead of the server's
// clock (a backlog), and a replica "wakes late" for a slot by reading a
// clock set just past the slot's tolerance when it releases it (Release
// makes no round trip without a quota, so the clock sync never sees that
// clock). Slots are compared as server instants (each replica's own
// conversion undone), so the replicas' clock conversions do not enter.

// makeUpRun is one replica in a makeUpScene.
type makeUpRun struct {
	ls    *LaneSlots
	shift *atomic.Int64 // added to time.Now by this replica's clock
	held  time.Time
	at    float64 // held as a server instant, converted when granted
}

// makeUpScene reserves rounds × len(reps) slots at interval iv round-robin;
// drop(round, replica) says whether that replica drops the slot it holds
// (late by half an interval past the tolerance) before it reserves again.
// It returns the server instants of the slots used and of all slots
// granted, sorted, and the number dropped.
func makeUpScene(t *testing.T, replicas, rounds int, iv time.Duration, drop func(round, replica int) bool,
	between func(round int, reps []*makeUpRun)) (used, granted []float64, dropped int) {
	t.Helper()
	rd := startRedis(t)
	ctx := context.Background()
	req := slotReq(iv)
	tol := shaper.SlotTolerance(iv, req.Slack, req.MinSpacing)
	var reps []*makeUpRun
	for range replicas {
		shift := new(atomic.Int64)
		rs := newSlots(t, rd.Addr, WithRedisClock(func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }))
		reps = append(reps, &makeUpRun{ls: rs.Lane("makeup"), shift: shift})
	}
	for round := range rounds {
		if between != nil {
			between(round, reps)
		}
		for i, r := range reps {
			if !r.held.IsZero() {
				if drop(round, i) {
					r.shift.Store(int64(time.Until(r.held) + tol + iv/2))
					if err := r.ls.Release(ctx, r.held, req); err != nil {
						t.Fatal(err)
					}
					r.shift.Store(0)
					dropped++
				} else {
					used = append(used, r.at)
				}
			}
			s, err := r.ls.Reserve(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			// Converted back at once, with the clock sync that converted it
			// (a later round trip may move the sync's anchor by a few µs).
			r.held, r.at = s, serverMicros(r.ls, s)
			granted = append(granted, r.at)
		}
	}
	for _, r := range reps {
		used = append(used, r.at)
	}
	slices.Sort(used)
	slices.Sort(granted)
	return used, granted, dropped
}

// quantum is the resolution of the script's instants: Lua keeps the
// server's microseconds (1.8e15 in 2026) in doubles, whose step there is
// 0.25 µs, and tat advances by rounded sums (at most half a step a slot).
const quantum = 0.25

// checkMadeUpWindows: consecutive used slots are at least min_spacing
// intervals apart, and every closed window of n intervals (n up to 300)
// holds at most n + 1 of them (SPEC G1). µs are the server's.
func checkMadeUpWindows(t *testing.T, used []float64, iv time.Duration) {
	t.Helper()
	ivUS := float64(iv) / float64(time.Microsecond)
	const eps = quantum
	for i := 1; i < len(used); i++ {
		if g := used[i] - used[i-1]; g < shaper.DefaultMinSpacing*ivUS-eps {
			t.Errorf("slots %d and %d are %.3f µs apart, under min_spacing × interval (%.3f µs)", i-1, i, g, shaper.DefaultMinSpacing*ivUS)
		}
	}
	for n := 1; n <= 300; n++ {
		w := float64(n) * ivUS
		for i, j := 0, 0; i < len(used); i++ {
			for j < len(used) && used[j]-used[i] <= w+eps {
				j++
			}
			if j-i > n+1 {
				t.Fatalf("%d slots in the closed window of %d intervals from slot %d, bound %d", j-i, n, i, n+1)
			}
		}
	}
}

// TestRedisLateDropMadeUp: a replica that drops its slot because it woke
// too late for it costs the schedule almost nothing: the slots after it are
// spaced min_spacing closer until MakeUpLag (0.9 interval) is made up, so
// after the drop the schedule is back within 0.1 interval of where it
// would have been had the slot been used; spacing and windows keep SPEC G1.
// Three drops in a row (three replicas, each dropping once) are made up
// only to MakeUpLag together, never as a burst.
func TestRedisLateDropMadeUp(t *testing.T) {
	iv := interval(150)
	ivUS := float64(iv) / float64(time.Microsecond)
	lag := float64(shaper.MakeUpLag(iv, 0, shaper.DefaultMinSpacing)) / float64(time.Microsecond)
	t.Run("one drop", func(t *testing.T) {
		// Two attempts: the slots are compared as server instants converted
		// back with each replica's clock sync, whose anchor a round trip of
		// several ms under CI's load (-race, packages in parallel) most
		// likely moved by ~2 ms once (made up 3,964 µs of 6,000 in one CI
		// run; 15 of 15 runs beside a CPU hog made up 5,996 µs). Not yet
		// measured; a wrong make-up fails both attempts.
		const attempts = 2
		for attempt := 1; ; attempt++ {
			used, granted, dropped := makeUpScene(t, 2, 40, iv, func(round, i int) bool { return round == 5 && i == 0 }, nil)
			if dropped != 1 {
				t.Fatalf("%d drops, want 1", dropped)
			}
			checkMadeUpWindows(t, used, iv)
			// The last slot, against the grid of all the slots granted.
			made := float64(len(granted)-1)*ivUS - (granted[len(granted)-1] - granted[0])
			t.Logf("attempt %d: %d slots granted, %d used; made up %.1f µs (MakeUpLag %.1f µs, an interval %.1f µs)", attempt, len(granted), len(used), made, lag, ivUS)
			if math.Abs(made-lag) <= float64(len(granted))*quantum/2 {
				return
			}
			if attempt == attempts {
				t.Errorf("made up %.1f µs for the dropped slot, want MakeUpLag = %.1f µs", made, lag)
				return
			}
			t.Logf("ATTEMPT %d: made up %.1f µs, want %.1f µs; once more", attempt, made, lag)
		}
	})
	t.Run("three drops at once", func(t *testing.T) {
		used, granted, dropped := makeUpScene(t, 3, 60, iv, func(round, i int) bool { return round == 5 }, nil)
		if dropped != 3 {
			t.Fatalf("%d drops, want 3", dropped)
		}
		checkMadeUpWindows(t, used, iv)
		made := float64(len(granted)-1)*ivUS - (granted[len(granted)-1] - granted[0])
		t.Logf("made up %.1f µs for three drops", made)
		if made > lag+float64(len(granted))*quantum/2 {
			t.Errorf("made up %.1f µs for three drops in a row, want at most MakeUpLag = %.1f µs", made, lag)
		}
	})
	// A replica reports its drop after the three others took their next
	// slots, which repaid part of what an earlier drop was owed: what they
	// repaid is not owed again, so the stretch after the dropped slot
	// holds at most MakeUpLag of make-up (else a window of n intervals held
	// n + 2 slots).
	t.Run("late reports", func(t *testing.T) {
		used, _, dropped := makeUpScene(t, 4, 60, iv, func(round, i int) bool { return i == 0 && round >= 3 && round <= 6 }, nil)
		if dropped != 4 {
			t.Fatalf("%d drops, want 4", dropped)
		}
		checkMadeUpWindows(t, used, iv)
	})
	// A shared pause forgets what was owed (SPEC G2: a pause earns no
	// credit): the slots after it are a whole interval apart.
	t.Run("pause forgets", func(t *testing.T) {
		used, _, _ := makeUpScene(t, 2, 30, iv, func(round, i int) bool { return round == 5 && i == 0 },
			func(round int, reps []*makeUpRun) {
				if round == 7 { // after the report (round 6), before most of the repayment
					if err := reps[1].ls.Pause(context.Background(), time.Now().Add(2*time.Second)); err != nil {
						t.Fatal(err)
					}
				}
			})
		checkMadeUpWindows(t, used, iv)
		n := 0
		for i := 1; i < len(used); i++ {
			if g := used[i] - used[i-1]; g > 100*ivUS { // the pause
				n = i
			}
		}
		if n == 0 {
			t.Fatal("no pause among the slots")
		}
		for i := n + 1; i < len(used); i++ {
			if g := used[i] - used[i-1]; math.Abs(g-ivUS) > quantum {
				t.Errorf("after the pause, slots %d and %d are %.3f µs apart, want one interval (%.3f): the pause earned make-up", i-1, i, g, ivUS)
			}
		}
	})
}

// TestLaneSlotsDropped: Dropped counts the slots a replica was too late
// for — the held slot it releases and the stale slots of its lease — with
// their lateness (the benchmark's account of a shortfall, section 6).
func TestLaneSlotsDropped(t *testing.T) {
	ctx := context.Background()
	// The clock stands still at the instants the test sets, so that the
	// lateness is exact whatever this machine's scheduling delays.
	rs, frozen := frozenSlots(t)
	ls := rs.Lane("dropped")
	var notified atomic.Int64 // what shaper_global_slots_dropped_total would count
	ls.OnDrop(func(n int) { notified.Add(int64(n)) })
	iv := interval(5000) // leases of 10 slots (leaseSpan 2 ms)
	req := slotReq(iv)
	tol := shaper.SlotTolerance(iv, req.Slack, req.MinSpacing)
	// Frozen from the first lease on: a slot of a fresh lease that is
	// already older than the tolerance when the answer arrives (a round
	// trip slower than the lag) is dropped and counted too.
	start := time.Now()
	frozen.Store(&start)
	held, err := ls.Reserve(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// Too late for the held slot: it is released.
	at := held.Add(tol + iv/2)
	frozen.Store(&at)
	if err := ls.Release(ctx, held, req); err != nil {
		t.Fatal(err)
	}
	if n, late := ls.Dropped(); n != 1 || late != tol+iv/2 {
		t.Fatalf("Dropped() = %d, %v after one release, want 1, %v", n, late, tol+iv/2)
	}
	// Four and a half intervals after the held slot: the lease's next four
	// slots are older than the tolerance, the fifth is not.
	at = held.Add(4*iv + iv/2)
	frozen.Store(&at)
	if _, err := ls.Reserve(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n, _ := ls.Dropped(); n != 5 {
		t.Errorf("Dropped() = %d, want 5 (1 released + 4 stale slots of the lease)", n)
	}
	// The released slot the lane counts itself (drain/global.go).
	if n := notified.Load(); n != 4 {
		t.Errorf("OnDrop was told of %d dropped slots, want 4 (the stale slots of the lease)", n)
	}
}

// TestLaneSlotsShift: a replica whose request reached the wire late moves
// the slots not granted yet later by the delay it reports (Shift; the
// script's "shift"), never the slots already granted, and a slot after the
// schedule's end (no slot granted after it) moves nothing. Slots are
// compared as server instants.
func TestLaneSlotsShift(t *testing.T) {
	rd := startRedis(t)
	ctx := context.Background()
	a, b := newSlots(t, rd.Addr).Lane("shift"), newSlots(t, rd.Addr).Lane("shift")
	iv := interval(100) // leases of one slot
	req := slotReq(iv)
	reserve := func(ls *LaneSlots) (time.Time, float64) {
		t.Helper()
		s, err := ls.Reserve(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return s, serverMicros(ls, s)
	}
	sa, a0 := reserve(a)
	_, b0 := reserve(b)
	const by = 3 * time.Millisecond
	if err := a.Shift(ctx, sa, by); err != nil {
		t.Fatal(err)
	}
	_, a1 := reserve(a)
	ivUS, byUS := float64(iv)/1e3, float64(by)/1e3
	// Each replica's conversion of its slot to a server instant is good to
	// half its best round trip; 200 µs is well above that on loopback.
	const near = 200.0
	if d := b0 - a0; math.Abs(d-ivUS) > near {
		t.Fatalf("b's slot %.0f µs after a's, want one interval (%.0f)", d, ivUS)
	}
	if d := a1 - b0; math.Abs(d-(ivUS+byUS)) > near {
		t.Errorf("the slot granted after the shift is %.0f µs after b's, want an interval and the shift (%.0f)", d, ivUS+byUS)
	}
	// A slot later than the schedule's end moves nothing.
	if err := b.Shift(ctx, sa.Add(time.Hour), by); err != nil {
		t.Fatal(err)
	}
	_, b1 := reserve(b)
	if d := b1 - a1; math.Abs(d-ivUS) > near {
		t.Errorf("after a shift for a slot never granted, the next slot is %.0f µs after the last, want one interval (%.0f)", d, ivUS)
	}
}

// TestRedisRepayKeepsMinSpacing: shaper.SlotRepayMax — the make-up of a
// dropped slot spaces the following slots closer, but with slack 0 never
// closer than min_spacing, at every rate: a replica's own pacer keeps
// min_spacing between its departures (Pacer.floored), and reached slots
// spaced closer only after them. Above SpacingMaxRate the floor-free
// make-up (60 µs at 2,500/s) spaced them at 85 % of the interval: the lane
// arrived 40 µs after slots whose tolerance is 60 µs, dropped them, and
// owed them again. With slack, where the pacer keeps no floor, the
// floor-free make-up stays (the owed cap, shaper.MakeUpLag, limits it to
// 12 µs a slot at 2,500/s here).
func TestRedisRepayKeepsMinSpacing(t *testing.T) {
	ctx := context.Background()
	rs, frozen := frozenSlots(t)
	for _, tc := range []struct {
		perSecond float64
		slack     int
	}{{500, 0}, {2500, 0}, {5000, 0}, {2500, 1}} {
		frozen.Store(nil)
		ls := rs.Lane(fmt.Sprintf("repay-%v-%d", tc.perSecond, tc.slack))
		iv := interval(tc.perSecond)
		req := slotReq(iv)
		req.Slack = tc.slack
		useUp := func() {
			ls.mu.Lock()
			ls.lease.next = ls.lease.n
			ls.mu.Unlock()
		}
		// Leases back to back until the schedule runs 200 ms ahead of now,
		// so that it keeps what it is owed (a schedule behind now forgets
		// it) through any stall of this test on two busy cores.
		var held time.Time
		for i := 0; time.Until(held) < 200*time.Millisecond; i++ {
			if i == 5000 {
				t.Fatalf("the schedule is %v ahead of now after %d leases", time.Until(held), i)
			}
			useUp()
			var err error
			if held, err = ls.Reserve(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		// The held slot is dropped half an interval past its tolerance:
		// its interval is owed, and sent with the next reserve.
		at := held.Add(shaper.SlotTolerance(iv, req.Slack, req.MinSpacing) + iv/2)
		frozen.Store(&at)
		if err := ls.Release(ctx, held, req); err != nil {
			t.Fatal(err)
		}
		useUp()
		if _, err := ls.Reserve(ctx, req); err != nil {
			t.Fatal(err)
		}
		ls.mu.Lock()
		sp := ls.lease.interval
		ls.mu.Unlock()
		floor := time.Duration(req.MinSpacing * float64(iv))
		t.Logf("%v/s, slack %d: slots %v apart while the make-up is repaid (interval %v, min spacing %v)", tc.perSecond, tc.slack, sp, iv, floor)
		if sp >= iv {
			t.Errorf("%v/s, slack %d: slots %v apart after a dropped slot, want closer than the interval %v (the make-up)", tc.perSecond, tc.slack, sp, iv)
		}
		if tc.slack == 0 && sp < floor-time.Microsecond {
			t.Errorf("%v/s, slack 0: slots %v apart, closer than min spacing %v: the lane's pacer reaches them late", tc.perSecond, sp, floor)
		}
		if want := shaper.SlotMakeUp(iv, req.MinSpacing); tc.slack > 0 && shaper.SlotRepayMax(iv, tc.slack, req.MinSpacing) != want {
			t.Errorf("%v/s, slack %d: SlotRepayMax %v, want the floor-free make-up %v (no floor without slack 0)", tc.perSecond, tc.slack,
				shaper.SlotRepayMax(iv, tc.slack, req.MinSpacing), want)
		}
	}
}

// frozenSlots returns RedisSlots on a fresh redis-server whose clock reads
// the instant frozen holds, or the time when it holds none.
func frozenSlots(t *testing.T) (*RedisSlots, *atomic.Pointer[time.Time]) {
	t.Helper()
	rd := startRedis(t)
	frozen := &atomic.Pointer[time.Time]{}
	rs := newSlots(t, rd.Addr, WithRedisClock(func() time.Time {
		if f := frozen.Load(); f != nil {
			return *f
		}
		return time.Now()
	}))
	return rs, frozen
}
