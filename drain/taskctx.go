package drain

import (
	"context"
	"sync"
	"time"
)

// taskContext is the context a task's sink call runs under: the task timeout
// (task.timeout) as a deadline, with nothing above it (a task outlives the
// lane's own context during a drain).
//
// It is context.WithDeadline(context.Background(), deadline) made only when
// a sink needs it (issue 15, CPU per message). Deadline and Err answer from
// the deadline alone; the first call of Done makes the real context and
// hands every later call to it, so a context derived from this one
// (net/http's transport derives one per request) joins the real one's tree
// as it would join WithDeadline's, with no goroutine to watch it. A sink that
// never looks (a no-op sink, a NATS publish that does not wait) costs one
// allocation instead of WithDeadline's four and a timer in the runtime's
// heap: 3.9 of the lane's 40.4 allocations per message at full speed, and
// about 4 % of its CPU (docs/performance.md, throughput).
//
// A sink that ignores its context is not stopped by either form: the task
// ends when Send returns.
type taskContext struct {
	deadline time.Time

	mu     sync.Mutex
	real   context.Context // nil until Done; then WithDeadline's
	cancel context.CancelFunc
	ended  bool // end was called: a context made after it is ended at once
	early  bool // end was called before the deadline (Err: Canceled)
}

// newTaskContext returns the context of a task due to end by deadline.
func newTaskContext(deadline time.Time) *taskContext {
	return &taskContext{deadline: deadline}
}

// Deadline reports the task's deadline; ok is always true.
func (c *taskContext) Deadline() (deadline time.Time, ok bool) { return c.deadline, true }

// Done returns the real context's channel, closed at the deadline or when
// the task ends.
func (c *taskContext) Done() <-chan struct{} { return c.made().Done() }

// Err is context.Canceled once the task ended before its deadline,
// context.DeadlineExceeded once the deadline passed, else nil
// (context.Context).
func (c *taskContext) Err() error {
	c.mu.Lock()
	real, ended, early := c.real, c.ended, c.early
	c.mu.Unlock()
	switch {
	case real != nil:
		return real.Err()
	case ended && early:
		return context.Canceled
	case ended || !time.Now().Before(c.deadline):
		return context.DeadlineExceeded
	}
	return nil
}

// Value is nil (context.Background has no values) until Done made the real
// context; then the real one's: the context package finds a parent's
// cancellation through it, after calling Done (context.parentCancelCtx).
func (c *taskContext) Value(key any) any {
	c.mu.Lock()
	real := c.real
	c.mu.Unlock()
	if real == nil {
		return nil
	}
	return real.Value(key)
}

// made returns the real context, making it on the first call.
func (c *taskContext) made() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.real == nil {
		c.real, c.cancel = context.WithDeadline(context.Background(), c.deadline)
		if c.ended {
			c.cancel()
		}
	}
	return c.real
}

// end cancels the context when its task ended at now (WithDeadline's
// cancel: Err is Canceled if that was before the deadline).
func (c *taskContext) end(now time.Time) {
	c.mu.Lock()
	c.ended, c.early = true, now.Before(c.deadline)
	cancel := c.cancel
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// String names the context as WithDeadline's would (fmt, logs).
func (c *taskContext) String() string {
	return "context.Background.WithDeadline(" + c.deadline.String() + " [task])"
}
