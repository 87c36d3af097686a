//go:build unix

package main

import "syscall"

// contextSwitches returns the voluntary plus involuntary context switches
// of the whole process so far (getrusage RUSAGE_SELF): each is a thread
// that blocked or was preempted, the wake-ups that cost CPU here (issue 15).
func contextSwitches() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Nvcsw + ru.Nivcsw
}
