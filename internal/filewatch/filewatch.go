// Package filewatch reports changes of files the daemon re-reads: its
// config file, and the HTTP sink's token, certificate and key files. It
// watches their directories, so renames into place and Kubernetes' ..data
// swaps are seen.
package filewatch

import (
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch calls onChange, from a goroutine of its own, debounce after the
// last event for any of paths (a rotation that writes a certificate and then
// its key, or a Vault agent's write-then-rename, is one change). It watches the files' directories, not the files,
// so that files renamed into place (Vault agent) and Kubernetes' swap of
// the ..data link of projected volumes and secrets are seen too . stop ends the watch
// and waits for a running onChange; it is never nil, also with an error.
func Watch(paths []string, debounce time.Duration, onChange func()) (stop func(), err error) {
	stop, _, err = WatchActivity(paths, debounce, onChange)
	return stop, err
}

// WatchActivity is Watch that also returns last, the time of the latest
// event for any of paths (zero before the first): a burst of writes goes
// on while last is more recent than the debounce, although onChange has
// not been called yet (the daemon's wait for an empty config file to be
// written, C31).
func WatchActivity(paths []string, debounce time.Duration, onChange func()) (stop func(), last func() time.Time, err error) {
	var lastNano atomic.Int64
	last = func() time.Time {
		if n := lastNano.Load(); n != 0 {
			return time.Unix(0, n)
		}
		return time.Time{}
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return func() {}, last, err
	}
	var files, dirs []string
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			abs = filepath.Clean(p)
		}
		files = append(files, abs)
		if d := filepath.Dir(abs); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			_ = w.Close()
			return func() {}, last, err
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var timer <-chan time.Time
		for {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if slices.Contains(files, filepath.Clean(ev.Name)) || filepath.Base(ev.Name) == "..data" {
					lastNano.Store(time.Now().UnixNano())
					timer = time.After(debounce)
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
			case <-timer:
				timer = nil
				onChange()
			}
		}
	}()
	return func() { _ = w.Close(); <-done }, last, nil
}
