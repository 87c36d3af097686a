package sources

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/internal/testserver"
)

// dedupJetStream starts an in-process NATS server with JetStream
// (internal/testserver) and returns a JetStream context on it and the
// server's URL.
func dedupJetStream(tb testing.TB) (jetstream.JetStream, string) {
	tb.Helper()
	ns := testserver.NATS(tb)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js, ns.ClientURL()
}

// TestKVDedup: SPEC §3 Delivered-key dedup on a real server — a key is not
// seen until recorded, then seen by this and by another client (another
// replica, or the daemon after a restart), whatever bytes it holds; the
// bucket is the lane's, with the window as its TTL, and keys of other lanes
// are not seen.
func TestKVDedup(t *testing.T) {
	js, url := dedupJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := NewKVDedup(ctx, js, "payments", 10*time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"msg-0001", "CALLBACKS:42", "a b/c..d.", "", "ключ*>", strings.Repeat("k", 5000)}
	for _, k := range keys {
		if seen, err := d.Seen(ctx, k); err != nil || seen {
			t.Fatalf("Seen(%.20q) before Record = %v, %v; want false", k, seen, err)
		}
		if err := d.Record(ctx, k); err != nil {
			t.Fatalf("Record(%.20q): %v", k, err)
		}
	}
	// Another connection: a second replica, or the next start.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	jsOther, _ := jetstream.New(nc)
	again, err := NewKVDedup(ctx, jsOther, "payments", 10*time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if seen, err := again.Seen(ctx, k); err != nil || !seen {
			t.Errorf("Seen(%.20q) from another client = %v, %v; want true", k, seen, err)
		}
	}
	other, err := NewKVDedup(ctx, jsOther, "refunds", time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	if seen, _ := other.Seen(ctx, "msg-0001"); seen {
		t.Error("lane refunds sees a key delivered by lane payments")
	}
	kv, err := js.KeyValue(ctx, DedupBucketPrefix+"payments")
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 10*time.Minute {
		t.Errorf("bucket TTL %v, want the window 10m", st.TTL())
	}
}

// TestKVDedupWindow: a key is forgotten after the window (the bucket's TTL;
// an entry the server has not removed yet counts as not seen), and a new
// window given to an existing bucket becomes its TTL.
func TestKVDedupWindow(t *testing.T) {
	js, _ := dedupJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := NewKVDedup(ctx, js, "short", time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Record(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if seen, _ := d.Seen(ctx, "k1"); !seen {
		t.Fatal("k1 not seen just after Record")
	}
	time.Sleep(1500 * time.Millisecond)
	if seen, err := d.Seen(ctx, "k1"); err != nil || seen {
		t.Errorf("Seen(k1) 1.5 s after Record with a 1 s window = %v, %v; want false", seen, err)
	}
	if _, err := NewKVDedup(ctx, js, "short", time.Hour, 1); err != nil {
		t.Fatal(err)
	}
	kv, _ := js.KeyValue(ctx, DedupBucketPrefix+"short")
	if st, err := kv.Status(ctx); err != nil || st.TTL() != time.Hour {
		t.Errorf("TTL after a new window: %v, %v; want 1h", st, err)
	}
	if _, err := NewKVDedup(ctx, js, "zero", 0, 1); err == nil {
		t.Error("NewKVDedup with window 0: no error")
	}
}

// TestKVDedupUnreachable: with the server gone, Seen and Record return an
// error within their context (the lane then delivers, and acks: at least
// once), not a false "seen".
func TestKVDedupUnreachable(t *testing.T) {
	ns := testserver.NATS(t)
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := NewKVDedup(ctx, js, "gone", time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Record(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	for _, op := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"Seen", func(ctx context.Context) error {
			seen, err := d.Seen(ctx, "k")
			if seen {
				t.Error("Seen = true with the server gone")
			}
			return err
		}},
		{"Record", func(ctx context.Context) error { return d.Record(ctx, "k2") }},
	} {
		octx, ocancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		start := time.Now()
		err := op.f(octx)
		ocancel()
		if err == nil {
			t.Errorf("%s with the server gone: no error", op.name)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%s took %v with a 500 ms context", op.name, took)
		}
	}
}

// BenchmarkDedup measures what delivered-key dedup costs per message
// against an in-process NATS server (the embedded server of the default
// config): a lookup of a new key (every delivery pays it), a lookup of a
// delivered key, a record, and both — then a lane's pattern at 1,000/s for
// b.N messages over 8 concurrent tasks (max_in_flight), with the latency
// each task adds and the CPU of the whole process (client and server) per
// message, beside the same loop without dedup (the pacing's own CPU). Run:
//
//	go test ./sources -run '^$' -bench BenchmarkDedup -benchtime 2000x -count 1
func BenchmarkDedup(b *testing.B) {
	js, _ := dedupJetStream(b)
	ctx := context.Background()
	d, err := NewKVDedup(ctx, js, "bench", 10*time.Minute, 1)
	if err != nil {
		b.Fatal(err)
	}
	var table []string
	row := func(name string, b *testing.B, extra string) {
		if b.N > 1 {
			table = append(table, fmt.Sprintf("| %-22s | %8d | %9.1f | %s", name, b.N,
				float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, extra))
		}
	}
	b.Run("seen-new-key", func(b *testing.B) {
		for i := range b.N {
			if _, err := d.Seen(ctx, fmt.Sprintf("new-%d", i)); err != nil {
				b.Fatal(err)
			}
		}
		row("Seen, new key", b, "")
	})
	for i := range 1000 {
		if err := d.Record(ctx, fmt.Sprintf("hit-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("seen-delivered-key", func(b *testing.B) {
		for i := range b.N {
			if _, err := d.Seen(ctx, fmt.Sprintf("hit-%d", i%1000)); err != nil {
				b.Fatal(err)
			}
		}
		row("Seen, delivered key", b, "")
	})
	b.Run("record", func(b *testing.B) {
		for i := range b.N {
			if err := d.Record(ctx, fmt.Sprintf("rec-%d-%d", b.N, i)); err != nil {
				b.Fatal(err)
			}
		}
		row("Record", b, "")
	})
	b.Run("seen+record", func(b *testing.B) {
		for i := range b.N {
			k := fmt.Sprintf("both-%d-%d", b.N, i)
			if _, err := d.Seen(ctx, k); err != nil {
				b.Fatal(err)
			}
			if err := d.Record(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
		row("Seen + Record", b, "")
	})
	// paced runs b.N messages at 1,000/s over 8 task goroutines, each doing
	// op, and reports op's latency and the process CPU per message.
	paced := func(b *testing.B, name string, op func(k string)) {
		const tasks = 8
		lat := make([]time.Duration, b.N)
		cpu0 := cpuTime()
		start := time.Now()
		var wg sync.WaitGroup
		next := make(chan int)
		for range tasks {
			wg.Go(func() {
				for i := range next {
					k := fmt.Sprintf("paced-%d-%d", b.N, i)
					t0 := time.Now()
					op(k)
					lat[i] = time.Since(t0)
				}
			})
		}
		for i := range b.N {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Millisecond)))
			next <- i
		}
		close(next)
		wg.Wait()
		took := time.Since(start)
		cpu := cpuTime() - cpu0
		slices.Sort(lat)
		p50, p99, pmax := lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
		cpuPer := float64(cpu.Microseconds()) / float64(b.N)
		b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
		b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
		b.ReportMetric(cpuPer, "cpu-µs/msg")
		if b.N > 1 {
			table = append(table, fmt.Sprintf("| %-22s | %8d | %9s | per task p50 %s, p99 %s, max %s; process CPU %.0f µs/msg = %.1f %% of a core at %.0f/s",
				name, b.N, "-", p50.Round(time.Microsecond), p99.Round(time.Microsecond),
				pmax.Round(time.Microsecond), cpuPer, cpuPer*float64(b.N)/took.Seconds()/1e4, float64(b.N)/took.Seconds()))
		}
	}
	b.Run("paced-1000/s-no-dedup", func(b *testing.B) {
		paced(b, "1,000/s, no dedup", func(string) {})
	})
	b.Run("paced-1000/s", func(b *testing.B) {
		paced(b, "1,000/s, Seen+Record", func(k string) {
			if _, err := d.Seen(ctx, k); err != nil {
				b.Error(err)
			}
			if err := d.Record(ctx, k); err != nil {
				b.Error(err)
			}
		})
	})
	fmt.Fprintf(os.Stdout, "\nDelivered-key dedup (sink.dedup_window) on an in-process NATS server:\n| %-22s | %8s | %9s | %s\n", "operation", "n", "µs/op", "")
	for _, r := range table {
		fmt.Fprintln(os.Stdout, r)
	}
}
