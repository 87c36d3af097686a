package drain

import (
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Tuning of the precise waiter (measured on these machines: docs/BENCHMARKS.md
// section 7 and the history of this file).
const (
	// maxEarly caps how early the waiter aims ahead of the deadline to absorb
	// its wake-up latency; the rest of the way it spins.
	maxEarly = 200 * time.Microsecond
	// earlyQuantile is the share of timer wake-ups the estimate of the
	// wake-up latency aims to bring back before the deadline. The rest wake
	// a little late: the pacer makes that up (SPEC G1, min_spacing), but up
	// to 1,000/s by a departure closer than one interval, which a strict
	// downstream may count against the lane. A higher share costs spin: the
	// latency spreads over ~15–25 µs between its median and its 90th
	// percentile here, and every µs of estimate above the actual latency is
	// a µs spun. Measured at 1,000/s: 0.75 spun ~8–9 µs per departure, the
	// median ~2–5 µs with about twice as many wake-ups late by more than 1 % of
	// an interval.
	earlyQuantile = 0.75
	// shortWait and shortQuantile: waits shorter than shortWait (rates above
	// ~2,000/s, where the pacer keeps no spacing floor and makes up a lag
	// under MakeUpLag at once) aim for the median instead: a few µs of
	// lateness cost nothing there, and the spin was up to half the waiter's CPU
	// at 10,000/s.
	shortWait     = 500 * time.Microsecond
	shortQuantile = 0.5
	// earlyStep is the step of the quantile estimate (see learn). One stall
	// of a millisecond moves it by 1.5 µs (the moving average of the latency
	// used before grew by 20 µs per stall and spun that much more for the
	// next dozen waits).
	earlyStep = 2 * time.Microsecond
	// minSleep is the shortest wait worth a timer: a wake-up takes ~20–50 µs
	// here, so a shorter wait is spun whole.
	minSleep = 50 * time.Microsecond
)

// PreciseWaiter sleeps until an absolute instant with microsecond precision
// without holding a scheduler slot (P) while it sleeps. It arms a timerfd
// (CLOCK_MONOTONIC, TFD_TIMER_ABSTIME; hrtimer precision, no timer slack)
// and waits for it in Go's network poller, so the goroutine is parked like
// any socket reader; it aims early by an estimate of the wake-up latency
// (a quantile of it, see earlyQuantile) and spins the remaining microseconds.
//
// Measured here (NOTES.md): Go's own timers wake up to ~1 ms late when idle
// (epoll_wait has a millisecond timeout) and several ms on a busy machine;
// clock_nanosleep is exact but blocks an OS thread *and* its P while in the
// syscall — with 2 cores that starves the sink's HTTP goroutines for
// milliseconds. A timerfd in the poller has neither problem.
//
// Its hot path makes no syscall through syscall.Syscall: arming the timerfd
// and reading it are non-blocking raw syscalls, and the clock offset to
// CLOCK_MONOTONIC is read once at Bind. A plain syscall's entersyscall wakes
// sysmon out of its deep sleep (all Ps were idle while the waiter slept), and
// sysmon then polled every 20 µs while the departure ran: on these machines
// that was three context switches per departure instead of one and about
// 40 % of the waiter's CPU.
//
// Cancellation is immediate: ctx and a token on the wake channel are watched
// by one goroutine per waiter (started by the first Wait that has something
// to watch, restarted when the caller passes another ctx or channel, stopped
// by Unbind; not one goroutine or context.AfterFunc per wait), which sets a
// read deadline in the past. A wake token that arrives between waits makes
// the next Wait return at once, as a buffered channel would.
// A PreciseWaiter is used by one goroutine at a time, between Bind and Unbind.
type PreciseWaiter struct {
	f     *os.File
	rc    syscall.RawConn
	fd    int
	err   error
	early time.Duration // estimate of the wake-up latency (see earlyQuantile)

	clock monoClock // time.Time to CLOCK_MONOTONIC, calibrated at Bind

	// read is the callback of rc.Read, built once: it arms the timer on its
	// first call (after the poller has reset the fd's readiness, so an expiry
	// cannot be missed) and reads the expiry afterwards.
	read    func(fd uintptr) bool
	armAt   int64 // CLOCK_MONOTONIC ns to arm at, for read's first call
	armed   bool
	readErr syscall.Errno
	buf     [8]byte

	watchWake <-chan struct{} // the wake channel the watcher reads
	watchDone <-chan struct{} // the ctx.Done() it reads
	stopWatch chan struct{}
	watchExit chan struct{}

	mu       sync.Mutex
	waiting  bool // a read of the timerfd is in progress
	woke     bool // the watcher interrupted that read for a wake token
	pending  bool // a wake token arrived between waits
	deadline bool // an interrupt set a read deadline in the past
}

// NewPreciseWaiter returns a precise waiter (Linux). It falls back to a
// plain timer if a timerfd cannot be created.
func NewPreciseWaiter() Waiter { return &PreciseWaiter{early: 50 * time.Microsecond} }

// Bind creates the timerfd.
func (w *PreciseWaiter) Bind() {
	if w.f != nil || w.err != nil {
		return
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		w.err = err
		return
	}
	f := os.NewFile(uintptr(fd), "shaper-timerfd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		w.err = err
		return
	}
	w.fd, w.f, w.rc = fd, f, rc
	w.clock.calibrate()
	if w.read == nil {
		w.read = w.readTimer
	}
}

// readTimer is the body of w.read.
func (w *PreciseWaiter) readTimer(fd uintptr) bool {
	if !w.armed {
		w.armed = true
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(w.armAt)}
		if _, _, e := unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, fd, unix.TFD_TIMER_ABSTIME,
			uintptr(unsafe.Pointer(&spec)), 0, 0, 0); e != 0 {
			w.readErr = e
			return true
		}
		return false // armed in the future: wait in the poller
	}
	return readExpiry(fd, &w.buf, &w.readErr) // false: woken before the expiry, wait again
}

// readExpiry reads a timerfd's expiry count with a raw syscall (the body of
// a rc.Read callback): true once read, or when the read failed (*errno
// set); false when it has not expired (EAGAIN: wait in the poller).
func readExpiry(fd uintptr, buf *[8]byte, errno *syscall.Errno) bool {
	for {
		_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		switch e {
		case 0:
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		*errno = e
		return true
	}
}

// monoClock converts a time.Time to the kernel's CLOCK_MONOTONIC in
// nanoseconds: time.Time's monotonic clock is CLOCK_MONOTONIC too, so the
// two differ by a constant, read once (calibrate).
type monoClock struct {
	base     time.Time // an instant ...
	baseMono int64     // ... and CLOCK_MONOTONIC then, ns
}

// calibrate reads CLOCK_MONOTONIC between two readings of time.Now and
// keeps the tightest of a few tries: the offset is then known to a fraction
// of a microsecond, which the early margin absorbs.
func (c *monoClock) calibrate() {
	best := time.Duration(1<<63 - 1)
	for range 5 {
		var ts unix.Timespec
		t1 := time.Now()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			continue
		}
		if d := time.Since(t1); d < best {
			best = d
			c.base, c.baseMono = t1.Add(d/2), ts.Nano()
		}
	}
}

// ns is t on CLOCK_MONOTONIC, in nanoseconds.
func (c *monoClock) ns(t time.Time) int64 { return c.baseMono + int64(t.Sub(c.base)) }

// Unbind stops the watcher and closes the timerfd; a later Bind makes a new
// one.
func (w *PreciseWaiter) Unbind() {
	w.stopWatcher()
	if w.f != nil {
		_ = w.f.Close()
		w.f, w.rc = nil, nil
	}
}

func (w *PreciseWaiter) stopWatcher() {
	if w.stopWatch != nil {
		close(w.stopWatch)
		<-w.watchExit
		w.stopWatch, w.watchExit = nil, nil
	}
	w.watchWake, w.watchDone = nil, nil
}

// watch makes sure that a goroutine turns a token on wake and the end of
// done into interrupts of the read in progress.
func (w *PreciseWaiter) watch(done, wake <-chan struct{}) {
	if done == w.watchDone && wake == w.watchWake {
		return
	}
	w.stopWatcher()
	if done == nil && wake == nil {
		return
	}
	w.watchDone, w.watchWake = done, wake
	w.stopWatch, w.watchExit = make(chan struct{}), make(chan struct{})
	stop, exit := w.stopWatch, w.watchExit
	go func() {
		defer close(exit)
		for {
			select {
			case <-stop:
				return
			case <-wake:
				w.mu.Lock()
				if w.waiting {
					w.woke = true
					w.interrupt()
				} else {
					w.pending = true
				}
				w.mu.Unlock()
			case <-done:
				done = nil // closed for good; Wait reads ctx.Err()
				w.mu.Lock()
				if w.waiting {
					w.interrupt()
				}
				w.mu.Unlock()
			}
		}
	}()
}

// interrupt ends the read in progress; w.mu is held.
func (w *PreciseWaiter) interrupt() {
	w.deadline = true
	_ = w.f.SetReadDeadline(time.Unix(1, 0))
}

// Wait implements Waiter.
func (w *PreciseWaiter) Wait(ctx context.Context, t time.Time, wake <-chan struct{}) (bool, error) {
	w.Bind()
	if w.err != nil {
		return TimerWaiter{}.Wait(ctx, t, wake)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	w.watch(ctx.Done(), wake)
	rem := time.Until(t)
	early := w.early
	if rem >= minSleep {
		// Always leave a timed wait of at least half the way, so that the
		// estimate keeps learning and never settles into spinning whole
		// intervals (a machine busy for a while once left it above the
		// interval at 10,000/s, where it spun a core until the lane stopped).
		early = min(early, rem/2)
	}
	aim := t.Add(-early)
	w.mu.Lock()
	if w.pending {
		w.pending = false
		w.mu.Unlock()
		return true, nil
	}
	if rem < minSleep || !aim.After(time.Now()) {
		w.mu.Unlock()
		spinUntil(t)
		return false, nil
	}
	if w.deadline {
		_ = w.f.SetReadDeadline(time.Time{})
		w.deadline = false
	}
	w.waiting, w.woke = true, false
	w.mu.Unlock()
	// A ctx ended before waiting was set was seen by the watcher with
	// nothing to interrupt; ctx.Err() is set before Done is closed.
	var rerr error
	if rerr = ctx.Err(); rerr == nil {
		w.armAt, w.armed, w.readErr = w.clock.ns(aim), false, 0
		rerr = w.rc.Read(w.read)
	}
	w.mu.Lock()
	w.waiting = false
	byWake := w.woke
	w.mu.Unlock()
	if rerr != nil || w.readErr != 0 {
		if w.armed {
			disarm := unix.ItimerSpec{}
			_, _, _ = unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(w.fd), 0, uintptr(unsafe.Pointer(&disarm)), 0, 0, 0)
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if byWake {
			return true, nil
		}
		if !errors.Is(rerr, os.ErrDeadlineExceeded) {
			// The timerfd failed (not seen in practice): a plain timer.
			return TimerWaiter{}.Wait(ctx, t, wake)
		}
		return false, nil
	}
	if byWake {
		return true, nil // interrupted just as the timer fired: re-read Next
	}
	q := earlyQuantile
	if rem < shortWait {
		q = shortQuantile
	}
	w.learn(time.Since(aim), q)
	spinUntil(t)
	return false, nil
}

// learn moves the estimate of the wake-up latency towards its q-th
// quantile (stochastic approximation: up by earlyStep×q after a late
// wake-up, down by earlyStep×(1−q) after an early one, which balances
// where a share q of the wake-ups is early), by a fixed step whatever the
// size of the sample: a stall (the thread lost its CPU) counts as one late
// wake-up.
func (w *PreciseWaiter) learn(late time.Duration, q float64) {
	if late > w.early {
		w.early = min(w.early+time.Duration(q*float64(earlyStep)), maxEarly)
	} else {
		w.early = max(w.early-time.Duration((1-q)*float64(earlyStep)), 0)
	}
}

// spinUntil spins the last microseconds on the clock (vDSO, no syscall).
func spinUntil(t time.Time) {
	for time.Now().Before(t) {
	}
}

// timerfdAlarm is the follower's alarm (follower.go): a timerfd that the
// departure loop's leader arms and disarms from its own thread while the
// follower waits for it in the network poller. A disarm before the expiry
// wakes no one (the kernel resets the expiry count), which is what makes a
// task run in line cost two raw syscalls and no wake-up.
type timerfdAlarm struct {
	f     *os.File
	rc    syscall.RawConn
	fd    uintptr
	clock monoClock
	buf   [8]byte
	err   syscall.Errno
	read  func(fd uintptr) bool
}

// newAlarm makes the alarm of one goroutine of the departure loop's pair
// (follower.go); an error when no timerfd can be made.
func (w *PreciseWaiter) newAlarm() (alarm, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "shaper-follower-timerfd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	a := &timerfdAlarm{f: f, rc: rc, fd: uintptr(fd)}
	a.clock.calibrate()
	a.read = a.readAlarm
	return a, nil
}

// arm sets the alarm to go off at at (at once when at has passed).
func (a *timerfdAlarm) arm(at time.Time) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(a.clock.ns(at), 1))} // 0 would disarm
	_, _, _ = unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, a.fd, unix.TFD_TIMER_ABSTIME,
		uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
}

// stop makes the alarm go off at once, through the file's reference count
// (rc.Control), so that a close by the waiter meanwhile leaves the fd
// number alone.
func (a *timerfdAlarm) stop() {
	_ = a.rc.Control(func(fd uintptr) {
		spec := unix.ItimerSpec{Value: unix.Timespec{Nsec: 1}}
		_, _, _ = unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, fd, unix.TFD_TIMER_ABSTIME,
			uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	})
}

// disarm cancels the alarm and an expiry not read yet.
func (a *timerfdAlarm) disarm() {
	var zero unix.ItimerSpec
	_, _, _ = unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, a.fd, 0, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
}

// wait returns once the alarm went off (an expiry was read), or with the
// error that makes the alarm unusable.
func (a *timerfdAlarm) wait() error {
	if err := a.rc.Read(a.read); err != nil {
		return err
	}
	if a.err != 0 {
		return a.err
	}
	return nil
}

// readAlarm is the body of a.read: true once an expiry was read (or the
// read failed: a.err); false when it has not gone off (or was disarmed
// since): wait in the poller.
func (a *timerfdAlarm) readAlarm(fd uintptr) bool { return readExpiry(fd, &a.buf, &a.err) }

// close releases the timerfd; call once its waiter has returned for good.
func (a *timerfdAlarm) close() { _ = a.f.Close() }
