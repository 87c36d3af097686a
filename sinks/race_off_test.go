//go:build !race

package sinks_test

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = false
