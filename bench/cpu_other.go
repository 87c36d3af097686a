//go:build !linux

package main

import (
	"errors"
	"time"
)

// runNanosleepCPU needs clock_nanosleep and prctl (Linux).
func runNanosleepCPU(perSecond float64, d time.Duration) cpuRun {
	return cpuRun{err: errors.New("clock_nanosleep loop: Linux only")}
}

// runRawNanosleepCPU needs clock_nanosleep and prctl (Linux).
func runRawNanosleepCPU(perSecond float64, d time.Duration) cpuRun {
	return runNanosleepCPU(perSecond, d)
}
