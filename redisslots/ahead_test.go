package redisslots

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shaper-dev/shaper/shaper"
)

// slowHook delays every command by d, spinning (a sleep here lasts 1 ms
// or more): a Redis round trip as slow as a loaded machine's.
type slowHook struct{ d time.Duration }

func (h slowHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for t0 := time.Now(); time.Since(t0) < h.d; {
		}
		return next(ctx, cmd)
	}
}
func (h slowHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedisLastSlotNotStale: issue 15 (bench section 6) — the call that
// hands out the last slot of a lease reserves the next lease in the
// background, not in line. The lane asks for a slot when its own pacer lets
// it go, (1 − min_spacing) of an interval before the slot (20 µs at
// 2,500/s); with round trips of 400 µs, reserving in line (the code before)
// handed every lease's last slot out about 380 µs after it was due, past
// its 20 µs tolerance, and the lane dropped it: at 1,000/s, with leases of
// two, the replicas reached about half the rate.
//
// What is asserted is that mechanism, call by call: after the first call,
// no call has to reserve in line (its lease used up and no reservation in
// flight: in line, every lease's end, 19 of 100), and a call served from
// the lease it holds is not stale. A call that takes the first slot of the
// next lease waits for the reservation made ahead when that round trip
// (400 µs, plus the wake-ups of the goroutine that makes it) outlasts the
// rest of the lease (2 slots, 800 µs): on a VM whose idle cores wake slowly
// 14 of those 19 were stale under -race (CI, session 16). That is the
// machine's, and the lane counts it (shaper_global_slots_dropped_total), so
// it is logged, not asserted; so are the held slots handed out late (this
// test's goroutine began late, or Reserve waited for the mutex that the
// reservation ahead takes around its round trip: 3–11 per run under -race
// here, 6–7 of them in Reserve).
func TestRedisLastSlotNotStale(t *testing.T) {
	rd := startRedis(t)
	rs := newSlots(t, rd.Addr)
	rs.client.AddHook(slowHook{d: 400 * time.Microsecond})
	ls := rs.Lane("ahead")
	req := slotReq(interval(2500))
	if k := leaseSize(req.Interval); k != 5 {
		t.Fatalf("lease size %d at 2,500/s, the test wants 5", k)
	}
	tol := shaper.SlotTolerance(req.Interval, req.Slack, req.MinSpacing)
	var prev time.Time
	var slots []time.Time
	// stale: slots later than their tolerance at hand-out, by what the
	// call had to do; inLine: calls after the first that reserved in line.
	// slowHeld: calls served from the lease held that took longer than the
	// tolerance themselves (the rest of staleHeld began late: this test's
	// goroutine, spinning beside the hook's spin on two cores, lost its
	// core for a while).
	var staleHeld, slowHeld, staleWaited, waited, inLine int
	const calls = 100
	for i := range calls {
		if i > 0 { // when the lane's pacer would let the departure go
			spinUntil(prev.Add(time.Duration(req.MinSpacing * float64(req.Interval))))
		}
		ls.mu.Lock()
		usedUp, inFlight := ls.lease.next >= ls.lease.n, ls.ahead != nil
		ls.mu.Unlock()
		t0 := time.Now()
		slot, err := ls.Reserve(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(t0)
		late := time.Since(slot) > tol
		switch {
		case usedUp && !inFlight:
			if i > 0 {
				inLine++
			}
		case usedUp:
			waited++
			if late {
				staleWaited++
			}
		case late:
			staleHeld++
			if took > tol {
				slowHeld++
			}
		}
		slots = append(slots, slot)
		spinUntil(slot)
		prev = slot
	}
	steady := slots[10:]
	rate := float64(len(steady)-1) / steady[len(steady)-1].Sub(steady[0]).Seconds()
	t.Logf("%.0f/s of 2,500/s over the last %d slots; later than their tolerance %v at hand-out: %d served from the lease held (%d of them taking longer than that in Reserve), %d of %d that waited for the lease reserved ahead; %d reserved in line after the first call",
		rate, len(steady), tol, staleHeld, slowHeld, staleWaited, waited, inLine)
	if inLine > 0 {
		t.Errorf("%d calls after the first reserved the next lease in line (leases of 5 at 2,500/s), want 0: the lease is not reserved ahead", inLine)
	}
	if staleWaited > 10 { // a lease reserved ahead too late: every one (19 of 19)
		t.Errorf("%d of %d calls that waited for the lease reserved ahead were later than their tolerance %v, want at most 10: the next lease is reserved too late", staleWaited, waited, tol)
	}
	// Let the lease reserved ahead arrive before the server stops.
	ls.mu.Lock()
	done := ls.ahead
	ls.mu.Unlock()
	if done != nil {
		<-done
	}
}

// spinUntil spins until t: the lane's precise waiter is that exact, Go's
// timers are 1 ms late here.
func spinUntil(t time.Time) {
	for time.Now().Before(t) {
	}
}
