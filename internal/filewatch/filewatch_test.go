package filewatch

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestWatch: a write and a rename into place are each one change after the
// debounce; a file next to it is not watched.
func TestWatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	if err := os.WriteFile(path, []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	stop, err := Watch([]string{path}, 50*time.Millisecond, func() { n.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	wait := func(want int32) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for n.Load() < want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(150 * time.Millisecond)
		if got := n.Load(); got != want {
			t.Fatalf("%d changes seen, want %d", got, want)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	wait(0)
	if err := os.WriteFile(path, []byte("b"), 0o600); err != nil {
		t.Fatal(err)
	}
	wait(1)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte("c"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	wait(2)
}

// TestWatchActivity: last is zero before an event for the paths, and the
// time of the latest one after it, before the debounce has ended.
func TestWatchActivity(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	stop, last, err := WatchActivity([]string{path}, time.Hour, func() {})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !last().IsZero() {
		t.Fatalf("last() = %v before any write", last())
	}
	before := time.Now()
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for last().IsZero() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l := last(); l.Before(before) || l.After(time.Now()) {
		t.Errorf("last() = %v after a write at %v", l, before)
	}
}
