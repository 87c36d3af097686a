package main

import (
	"errors"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// runNanosleepCPU is the physical limit of section 7 as the issue defines
// it: one goroutine locked to its OS thread (never unlocked, so the thread,
// with its timer slack, exits with the goroutine), timer slack 1 µs,
// unix.ClockNanosleep to absolute CLOCK_MONOTONIC deadlines one interval
// apart. A lag above 0.9 interval is forgiven, as shaper.Pacer does, so a
// stall does not turn into a burst.
func runNanosleepCPU(perSecond float64, d time.Duration) cpuRun {
	return nanosleepLoop(perSecond, d, func(req *unix.Timespec) error {
		return unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, req, nil)
	})
}

// runRawNanosleepCPU is the same loop with clock_nanosleep as a raw
// syscall: the Go runtime does not know the thread sleeps (no entersyscall,
// so no P handoff and no sysmon), which leaves the kernel's own cost of a
// wake-up. It holds its P while it sleeps — unusable next to other
// goroutines on 2 cores, a floor for comparison only.
func runRawNanosleepCPU(perSecond float64, d time.Duration) cpuRun {
	return nanosleepLoop(perSecond, d, func(req *unix.Timespec) error {
		_, _, e := unix.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME,
			uintptr(unsafe.Pointer(req)), 0, 0, 0)
		if e != 0 {
			return e
		}
		return nil
	})
}

func nanosleepLoop(perSecond float64, d time.Duration, sleep func(*unix.Timespec) error) cpuRun {
	n := departures(perSecond, d)
	done := make(chan cpuRun)
	go func() {
		runtime.LockOSThread()
		if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0); err != nil {
			done <- cpuRun{err: err}
			return
		}
		iv := int64(float64(time.Second) / perSecond)
		maxLag := int64(0.9 * float64(iv))
		var ts unix.Timespec
		var runErr error
		r := measureLoop(n, func(start time.Time, record func(dep, sched time.Time) bool) {
			if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
				runErr = err
				return
			}
			// The kernel's CLOCK_MONOTONIC and time.Time's monotonic reading
			// differ by a constant: base and start were read together.
			base := ts.Nano()
			deadline := base
			for {
				deadline += iv
				req := unix.NsecToTimespec(deadline)
				for {
					err := sleep(&req)
					if err == nil {
						break
					}
					if !errors.Is(err, syscall.EINTR) {
						runErr = err
						return
					}
				}
				now := time.Now()
				if !record(now, start.Add(time.Duration(deadline-base))) {
					return
				}
				if lagged := int64(now.Sub(start)) + base - maxLag; lagged > deadline {
					deadline = lagged
				}
			}
		})
		r.err = runErr
		done <- r
	}()
	return <-done
}
