package sinks

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/shaper-dev/shaper/internal/filewatch"
)

// sink.auth kind bearer_file: a token read from a file (auth.go).

// bearerFile serves "Bearer <contents of path>", re-read when the file or
// its directory changes (renames into place, Kubernetes' ..data swap) and
// after a 401.
type bearerFile struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[string] // the header value
	mu   sync.Mutex             // serialises reads of the file
	stop func()
}

func newBearerFile(path string, log *slog.Logger) (*bearerFile, error) {
	b := &bearerFile{path: path, log: log}
	if err := b.load(); err != nil {
		return nil, &ConfigProblem{Key: "auth.path", Message: err.Error()}
	}
	stop, err := filewatch.Watch([]string{path}, fileDebounce, func() {
		if err := b.load(); err != nil {
			log.Warn("sink kept its bearer token: the file did not re-read", "key", "sink.auth.path", "err", err)
		}
	})
	if err != nil {
		log.Warn("bearer token file not watched: it is re-read after a 401 only", "key", "sink.auth.path", "err", err)
	}
	b.stop = stop
	return b, nil
}

// load re-reads the file; on failure the last token stays.
func (b *bearerFile) load() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	tok, err := readBearer(b.path)
	if err != nil {
		return err
	}
	v := "Bearer " + tok
	b.cur.Store(&v)
	return nil
}

func (b *bearerFile) ready() (string, bool) { return *b.cur.Load(), true }

func (b *bearerFile) wait(context.Context) (string, error) { return *b.cur.Load(), nil }

// renew re-reads the file once; a token that did not change gives
// errSameCredential (a retry would be refused alike).
func (b *bearerFile) renew(_ context.Context, used string) (string, error) {
	if err := b.load(); err != nil {
		b.log.Warn("sink could not re-read its bearer token after a 401", "key", "sink.auth.path", "err", err)
	}
	if v := *b.cur.Load(); v != used {
		return v, nil
	}
	return "", errSameCredential
}

func (b *bearerFile) close() { b.stop() }
