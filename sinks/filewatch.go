package sinks

import (
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
)

// fileDebounce is how long after the last event for a watched file
// watchFiles calls back: a rotation that writes a certificate and then its
// key, or a Vault agent's write-then-rename, is one change.
const fileDebounce = 100 * time.Millisecond

// watchFiles calls onChange, from a goroutine of its own, fileDebounce after
// any of paths changes. It watches the files' directories, not the files,
// so that files renamed into place (Vault agent) and Kubernetes' swap of
// the ..data link of projected volumes and secrets are seen too (as
// cmd/shaper/internal/daemon watches its config file). stop ends the watch
// and waits for a running onChange; it is never nil, also with an error.
func watchFiles(paths []string, onChange func()) (stop func(), err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return func() {}, err
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
			return func() {}, err
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var debounce <-chan time.Time
		for {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if slices.Contains(files, filepath.Clean(ev.Name)) || filepath.Base(ev.Name) == "..data" {
					debounce = time.After(fileDebounce)
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
			case <-debounce:
				debounce = nil
				onChange()
			}
		}
	}()
	return func() { _ = w.Close(); <-done }, nil
}
