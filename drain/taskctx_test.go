package drain

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

// The task's context behaves as context.WithDeadline(Background, deadline)
// whether or not a sink ever looks at Done (taskctx.go).
func TestTaskContextWithoutDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c := newTaskContext(start.Add(time.Second))
		if d, ok := c.Deadline(); !ok || !d.Equal(start.Add(time.Second)) {
			t.Fatalf("Deadline() = %v, %v; want %v, true", d, ok, start.Add(time.Second))
		}
		if err := c.Err(); err != nil {
			t.Fatalf("Err() before the deadline = %v", err)
		}
		if v := c.Value("k"); v != nil {
			t.Fatalf("Value = %v, want nil", v)
		}
		time.Sleep(time.Second)
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err() at the deadline = %v, want DeadlineExceeded", err)
		}
		select { // made after the deadline: closed at once
		case <-c.Done():
		default:
			t.Fatal("Done() after the deadline is not closed")
		}
		c.end(time.Now())
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err() after end = %v, want DeadlineExceeded still", err)
		}

		e := newTaskContext(time.Now().Add(time.Second))
		e.end(time.Now())
		if err := e.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err() of an ended task = %v, want Canceled", err)
		}
		select {
		case <-e.Done():
		default:
			t.Fatal("Done() of an ended task is not closed")
		}
	})
}

// A context derived from the task's (as net/http derives one per request)
// is cancelled at the task's deadline and at its end, through the real
// context's tree: no goroutine watches it (a custom parent without that
// would cost one per derived context).
func TestTaskContextDerived(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c := newTaskContext(start.Add(time.Second))
		g := runtime.NumGoroutine()
		child, cancel := context.WithCancel(context.WithValue(c, ctxKeyTest{}, 1))
		defer cancel()
		// More, not different: a goroutine of an earlier test may end
		// between the two counts (runtime.NumGoroutine counts the process).
		if n := runtime.NumGoroutine(); n > g {
			t.Fatalf("deriving a context started %d goroutine(s)", n-g)
		}
		if child.Value(ctxKeyTest{}) != 1 {
			t.Fatal("the value above the task's context is lost")
		}
		select {
		case <-child.Done():
			t.Fatal("child done before the deadline")
		case <-time.After(999 * time.Millisecond):
		}
		<-child.Done()
		if took := time.Since(start); took != time.Second {
			t.Fatalf("child done after %v, want the task's deadline, 1s", took)
		}
		if err := child.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("child Err() = %v, want DeadlineExceeded", err)
		}
		if err := context.Cause(child); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Cause(child) = %v", err)
		}

		d := newTaskContext(time.Now().Add(time.Hour))
		child2, cancel2 := context.WithCancel(d)
		defer cancel2()
		d.end(time.Now()) // the task ended: what it started is cancelled
		select {
		case <-child2.Done():
		default:
			t.Fatal("a context derived from an ended task is not done")
		}
		if err := child2.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("child2 Err() = %v, want Canceled", err)
		}
	})
}

type ctxKeyTest struct{}

// BenchmarkTaskContext: the task timeout's cost per task, as runTask pays
// it, for a sink that never looks at Done and for one that does
// (go test -run '^$' -bench TaskContext -benchmem ./drain/).
func BenchmarkTaskContext(b *testing.B) {
	b.Run("WithDeadline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Minute))
			_ = ctx.Err()
			cancel()
		}
	})
	b.Run("taskContext", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			now := time.Now()
			c := newTaskContext(now.Add(time.Minute))
			c.end(now)
		}
	})
	b.Run("taskContext+Done", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			now := time.Now()
			c := newTaskContext(now.Add(time.Minute))
			_ = c.Done()
			c.end(now)
		}
	})
}
