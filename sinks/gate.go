package sinks

import (
	"errors"
	"fmt"
	"sync"

	"github.com/shaper-dev/shaper/shaper"
)

// ErrClosed is wrapped by the retryable *shaper.SinkError that Send returns
// after Close.
var ErrClosed = errors.New("sinks: sink closed")

// gate tracks the Sends in progress so that Close can wait for them, and
// refuses new ones once Close has begun. Its zero value is open.
type gate struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// enter registers a Send; it reports false once the gate is closed. A true
// result must be paired with leave.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	return true
}

// leave ends a Send registered by enter.
func (g *gate) leave() { g.wg.Done() }

// close refuses new Sends and waits for those in progress. It reports true
// to the first caller only; later calls return false at once.
func (g *gate) close() bool {
	g.mu.Lock()
	first := !g.closed
	g.closed = true
	g.mu.Unlock()
	if first {
		g.wg.Wait()
	}
	return first
}

// retryable wraps err, prefixed with what failed, in a retryable SinkError
// with no status.
func retryable(what string, err error) error {
	return &shaper.SinkError{Err: fmt.Errorf("%s: %w", what, err)}
}
