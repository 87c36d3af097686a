package testserver

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WithSteppableClock runs redis-server under libfaketime, so that a test
// can step the server's wall clock (TIME, what the shared schedule runs on)
// with [Redis.StepClock] while it runs; the monotonic clock, which Redis's
// own timers use, stays real (FAKETIME_DONT_FAKE_MONOTONIC). libfaketime
// alone aborts Debian's redis-server at start-up (its libjemalloc calls
// clock_gettime while libfaketime initialises; docs/lessons.md): tcmalloc
// (libtcmalloc-minimal4) is preloaded first, so that libfaketime's own
// start-up allocates through tcmalloc, not jemalloc. Without either library
// the test is skipped, except under CI=true, where it fails.
func WithSteppableClock(t testing.TB) RedisOption {
	t.Helper()
	tc := needFile(t, "libtcmalloc_minimal.so.4 (libtcmalloc-minimal4)", "/usr/lib/*/libtcmalloc_minimal.so.4")
	ft := needFile(t, "libfaketime.so.1 (libfaketime)", "/usr/lib/*/faketime/libfaketime.so.1")
	file := filepath.Join(t.TempDir(), "faketime")
	if err := os.WriteFile(file, []byte("+0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(r *Redis) {
		r.clockFile = file
		r.env = append(r.env, "LD_PRELOAD="+tc+":"+ft,
			"FAKETIME_TIMESTAMP_FILE="+file,
			"FAKETIME_NO_CACHE=1", // read the file at every clock read: a step applies at once
			"FAKETIME_DONT_FAKE_MONOTONIC=1")
	}
}

// StepClock sets the server's wall clock to the real time plus offset
// (whole seconds; negative is behind), at once. The server must have been
// started WithSteppableClock.
func (r *Redis) StepClock(offset time.Duration) {
	r.t.Helper()
	if r.clockFile == "" {
		r.t.Fatal("StepClock: redis-server not started WithSteppableClock")
	}
	line := fmt.Sprintf("%+d\n", int64(offset/time.Second))
	tmp := r.clockFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(line), 0o600); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Rename(tmp, r.clockFile); err != nil { // never a half-written file
		r.t.Fatal(err)
	}
}

// needFile finds a file matching pattern; without one the test is skipped,
// except under CI=true, where that is a failure (scripts/test.sh installs
// what). It returns the path.
func needFile(t testing.TB, what, pattern string) string {
	t.Helper()
	m, _ := filepath.Glob(pattern)
	if len(m) == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found (scripts/test.sh installs it)", what)
		}
		t.Skipf("%s not found; run scripts/test.sh to install it", what)
	}
	return m[0]
}
