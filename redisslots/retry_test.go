package redisslots

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
)

// TestRetryOnce: which failed calls Reserve tries once more (retry.go).
func TestRetryOnce(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{&net.OpError{Op: "read", Err: timeoutErr{}}, true},
		{fmt.Errorf("redis schedule k: reserve: %w", io.EOF), true},
		{io.ErrUnexpectedEOF, true},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, true},
		{&net.OpError{Op: "write", Err: syscall.EPIPE}, true},
		{net.ErrClosed, true},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, false},
		{fmt.Errorf("ERR shaper: bad reserve arguments"), false},
		{context.Canceled, false},
	} {
		if got := retryOnce(tc.err); got != tc.want {
			t.Errorf("retryOnce(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestReserveSurvivesBrokenConnection: the server closes the connection of
// a reservation under way (CLIENT KILL while CLIENT PAUSE WRITE holds it,
// as a failover kills the old master's clients): Reserve dials again and
// gets its slot instead of failing, so the lane does not fall back alone
// while the other replicas go on sharing the full limit.
func TestReserveSurvivesBrokenConnection(t *testing.T) {
	r := startRedis(t)
	rs, err := NewRedisSlots(config.Redis{Addr: r.Addr, KeyPrefix: "test", Timeout: time.Second, ReplicasHint: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	ctx := context.Background()
	if err := rs.Load(ctx); err != nil {
		t.Fatal(err)
	}
	lane := rs.Lane("broken")
	req := slotReq(20 * time.Millisecond)
	if _, err := lane.Reserve(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := r.Do("CLIENT", "PAUSE", "400", "WRITE"); got != "+OK" {
		t.Fatalf("CLIENT PAUSE: %q", got)
	}
	done := make(chan error, 1)
	go func() {
		_, err := lane.Reserve(ctx, req)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the reservation waits in the pause
	if got := r.Do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); got == "" || got[0] != ':' || got == ":0" {
		t.Fatalf("CLIENT KILL: %q, want the number of clients killed (≥ 1)", got)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Reserve after its connection was killed: %v; want a slot (one retry on a new connection)", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Reserve did not return within 3 s")
	}
}

// TestReserveWaitsOutAFailoverPause: a manual CLUSTER FAILOVER pauses the
// old master's writes until its replica caught up (CLIENT PAUSE WRITE, as
// here for 120 ms, more than the 50 ms timeout): the call times out, and
// the retry, given retryTimeouts × the timeout, gets the slot, so the lane
// does not fall back alone (TestGlobalRateRedisCluster saw 73 in a 1 s
// window of a 50/s lane when it did).
func TestReserveWaitsOutAFailoverPause(t *testing.T) {
	r := startRedis(t)
	lane := newSlots(t, r.Addr).Lane("paused") // timeout 50 ms
	ctx := context.Background()
	req := slotReq(20 * time.Millisecond)
	if _, err := lane.Reserve(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := r.Do("CLIENT", "PAUSE", "120", "WRITE"); got != "+OK" {
		t.Fatalf("CLIENT PAUSE: %q", got)
	}
	start := time.Now()
	_, err := lane.Reserve(ctx, req)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Reserve during a 120 ms write pause: %v after %v; want a slot from the retry", err, took)
	}
	t.Logf("slot after %v", took)
}

// TestReserveWaitsOutARestart: a redis-server restarted on its port refuses
// connections for tens of ms (46–66 ms in field case C33). A reservation
// that meets that after an answer dials again every restartRedial and gets
// its slot, instead of falling back while the other replicas, whose calls
// fell outside those milliseconds, go on sharing the full limit. A server
// that stays down fails the reservation after restartWait, once: the next
// ones (the lane's probes while it paces locally) fail at once, until
// Redis answers again; so does a lane's first reservation. The waits dial
// the port with a dialer of their own: go-redis's pool counts failed dials
// towards a breaker of 10 × GOMAXPROCS that only its own background dialler
// resets, so the test must also pass with -cpu 1 (scripts/test.sh runs it
// so).
func TestReserveWaitsOutARestart(t *testing.T) {
	r := startRedis(t)
	lane := newSlots(t, r.Addr).Lane("restart") // timeout 50 ms
	ctx := context.Background()
	req := slotReq(20 * time.Millisecond)
	if _, err := lane.Reserve(ctx, req); err != nil {
		t.Fatal(err)
	}
	const down = 50 * time.Millisecond
	r.Kill()
	killed := time.Now()
	back := make(chan time.Duration, 1)
	go func() {
		time.Sleep(down)
		r.Start() // returns once it answers PING
		back <- time.Since(killed)
	}()
	start := time.Now()
	_, err := lane.Reserve(ctx, req)
	took := time.Since(start)
	outage := <-back
	t.Logf("across a restart (the server answered again %v after the kill): %v, %v", outage, took, err)
	switch {
	case outage > restartWait-restartRedial:
		// A machine too busy to start redis-server within the wait: the
		// lane rightly falls back; nothing to judge.
		t.Logf("the restart took longer than the wait (%v): not judged", restartWait)
	case err != nil:
		t.Fatalf("Reserve across a restart of %v: %v; want a slot", outage, err)
	case took < down/2:
		t.Errorf("Reserve returned after %v, before the server was back (%v)", took, down)
	}

	r.Kill() // the restart above is done: its outage was received
	start = time.Now()
	_, err = lane.Reserve(ctx, req)
	took = time.Since(start)
	t.Logf("down: %v, %v", took, err)
	if err == nil || took < restartWait || took > restartWait+time.Second {
		t.Errorf("Reserve with the server down: %v after %v; want an error after restartWait (%v)", err, took, restartWait)
	}
	start = time.Now()
	_, err = lane.Reserve(ctx, req)
	took = time.Since(start)
	t.Logf("still down: %v, %v", took, err)
	if err == nil || took > restartWait/3 {
		t.Errorf("a probe while down: %v after %v; want an error at once (the lane paces locally)", err, took)
	}
	r.Start()
	if _, err := lane.Reserve(ctx, req); err != nil {
		t.Fatalf("Reserve once the server is back: %v", err)
	}

	// A lane that Redis never answered is not waiting for a restart: at
	// start with Redis down it falls back at once.
	fresh := newSlots(t, r.Addr).Lane("fresh")
	r.Kill()
	start = time.Now()
	_, err = fresh.Reserve(ctx, req)
	took = time.Since(start)
	if err == nil || took > restartWait/3 {
		t.Errorf("a first reservation with the server down: %v after %v; want an error at once", err, took)
	}
}

// TestNoRetryWhileDown: a reservation that timed out is tried once more,
// with retryTimeouts × the timeout (TestReserveWaitsOutAFailoverPause), but
// not while the last one failed (LaneSlots.down): the lane then paces
// locally and its reservations are probes, which must fail within one
// timeout instead of holding its local pace for seven. Redis here stops
// answering (CLIENT PAUSE ALL) and comes back: the first reservation fails
// after both calls, the next within one timeout, and the first after the
// pause gets its slot.
func TestNoRetryWhileDown(t *testing.T) {
	r := startRedis(t)
	const timeout = 50 * time.Millisecond
	lane := newSlots(t, r.Addr).Lane("probe") // timeout 50 ms
	ctx := context.Background()
	req := slotReq(20 * time.Millisecond)
	if _, err := lane.Reserve(ctx, req); err != nil {
		t.Fatal(err)
	}
	const pause = 1500 * time.Millisecond
	paused := time.Now()
	if got := r.Do("CLIENT", "PAUSE", strconv.Itoa(int(pause.Milliseconds())), "ALL"); got != "+OK" {
		t.Fatalf("CLIENT PAUSE: %q", got)
	}
	start := time.Now()
	_, err := lane.Reserve(ctx, req)
	first := time.Since(start)
	if err == nil || first < (1+retryTimeouts)*timeout {
		t.Fatalf("Reserve while Redis does not answer: %v after %v; want an error after the call and its retry (%v)", err, first, (1+retryTimeouts)*timeout)
	}
	for i := range 3 {
		start = time.Now()
		_, err = lane.Reserve(ctx, req)
		took := time.Since(start)
		t.Logf("probe %d while down: %v, %v", i, took, err)
		if err == nil {
			t.Fatalf("probe %d while Redis is paused: a slot", i)
		}
		if took >= (1+retryTimeouts)*timeout/2 {
			t.Errorf("probe %d while down took %v; want one call (timeout %v), not a retry (%v more)", i, took, timeout, retryTimeouts*timeout)
		}
	}
	time.Sleep(time.Until(paused.Add(pause + 100*time.Millisecond)))
	if _, err := lane.Reserve(ctx, req); err != nil {
		t.Fatalf("Reserve once Redis answers again: %v", err)
	}
}
