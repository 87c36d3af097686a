//go:build unix

package main

import (
	"syscall"
	"time"
)

// cpuTime returns the user plus system CPU time the whole process has used
// (getrusage RUSAGE_SELF): every goroutine, the runtime and, where the
// benchmark runs one, the embedded NATS server.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
