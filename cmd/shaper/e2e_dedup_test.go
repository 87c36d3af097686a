package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// freezingDownstream answers 204 until it has answered `after` distinct
// keys; from the next request on it is frozen: requests hang (no answer,
// not counted as delivered) until the client goes away or thaw is called.
// frozen closes when the first request hangs. So a SIGKILL at that moment
// finds no 2xx that the shaper has not read: every duplicate afterwards is
// one the shaper had delivered, recorded and acked, whose ack was lost.
type freezingDownstream struct {
	after  int
	frozen chan struct{}
	thawed chan struct{}

	mu     sync.Mutex
	ok     map[string]int // key -> 204s answered
	isCold bool
}

func newFreezingDownstream(t *testing.T, after int) (*freezingDownstream, string) {
	t.Helper()
	d := &freezingDownstream{after: after, frozen: make(chan struct{}), thawed: make(chan struct{}), ok: map[string]int{}}
	srv := newStampedServer(t, d.serveHTTP)
	return d, srv.URL + "/callback"
}

func (d *freezingDownstream) serveHTTP(w http.ResponseWriter, r *http.Request, _ time.Time) {
	key := r.Header.Get("Idempotency-Key")
	d.mu.Lock()
	if !d.isCold && len(d.ok) >= d.after {
		d.isCold = true
		close(d.frozen)
	}
	cold := d.isCold
	d.mu.Unlock()
	if cold {
		select {
		case <-r.Context().Done(): // the shaper died: no answer
			return
		case <-d.thawed:
		}
	}
	d.mu.Lock()
	d.ok[key]++
	d.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (d *freezingDownstream) thaw() { close(d.thawed) }

// counts returns how many distinct keys were answered 204 and how many
// answers were duplicates.
func (d *freezingDownstream) counts() (distinct, dups int, dupKeys []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, n := range d.ok {
		if n > 1 {
			dups += n - 1
			dupKeys = append(dupKeys, k)
		}
	}
	return len(d.ok), dups, dupKeys
}

// killRun is one SIGKILL scenario: a shaper with its embedded NATS server
// (the default config) delivers 1,000 jobs at 200/s; once 300 were answered
// the downstream freezes, and 3 ms later the shaper is SIGKILLed; a second
// shaper on the same store delivers the rest.
type killRun struct {
	duplicates, distinct, skipped int
	dupKeys                       []string
}

func runKill(t *testing.T, bin, dedupWindow string) killRun {
	t.Helper()
	down, url := newFreezingDownstream(t, 300)
	natsAddr, admin := freeAddr(t), freeAddr(t)
	store := filepath.Join(t.TempDir(), "nats")
	cfg := writeFile(t, "config.yaml", fmt.Sprintf(`
nats: { url: "", embedded: { listen: %q, store_dir: %q } }
admin: { listen: %q }
shutdown: { drain_timeout: 2s }
downstreams:
  dd:
    source: { stream: E2E_DD, subjects: ["e2e.dd.>"], ack_wait: 3s, max_deliver: 20 }
    bucket: { capacity: 500 }
    rate: { limit: 200/s }
    task: { timeout: 2s, max_in_flight: 8 }
    sink: { kind: http, url: %q, dedup_window: %s }
`, natsAddr, store, admin, url, dedupWindow))
	first := startChild(t, bin, "run", "-c", cfg)
	waitReady(t, admin, 20*time.Second)
	js := connectJS(t, "nats://"+natsAddr)
	keys := keysOf("dd", 1000)
	publishWith(t, js, "e2e.dd.job", keys, nil)
	select {
	case <-down.frozen:
	case <-time.After(20 * time.Second):
		t.Fatal("the downstream never reached 300 deliveries")
	}
	time.Sleep(3 * time.Millisecond) // the shaper reads the last 204s, records and acks them
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, exited := first.wait(5 * time.Second); !exited {
		t.Fatal("no exit after SIGKILL")
	}
	down.thaw()
	second := startChild(t, bin, "run", "-c", cfg)
	waitReady(t, admin, 20*time.Second)
	js = connectJS(t, "nats://"+natsAddr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n, _, _ := down.counts(); n >= len(keys) {
			break
		}
		if time.Now().After(deadline) {
			n, _, _ := down.counts()
			t.Fatalf("after the restart only %d of %d keys delivered", n, len(keys))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The messages whose acks the kill lost come back (at once, or after
	// ack_wait): wait until the consumer has nothing left.
	waitConsumerSettled(t, js, "E2E_DD", "shaper-dd", 15*time.Second)
	r := killRun{}
	r.skipped = int(metricValue(t, scrape(t, admin), "shaper_deliveries_total", map[string]string{"lane": "dd", "outcome": "duplicate_skipped"}))
	stopShaper(t, second, 15*time.Second)
	r.distinct, r.duplicates, r.dupKeys = down.counts()
	return r
}

// TestE2EDedupSIGKILL: SPEC §3 Delivered-key dedup — a SIGKILL of a shaper
// running its embedded NATS server loses the acks the server had not yet
// written (it stores consumer state about 10 times a second, NOTES.md):
// those messages, delivered and acked, come back after the restart. Without
// sink.dedup_window the downstream gets them twice; with dedup_window 10m
// the second shaper finds their keys in the key-value bucket (written before
// each ack, on the same server's store) and acks them without a call: the
// downstream sees each key once. A run whose kill happened to lose no ack
// (the server wrote its state in the few ms before the kill) proves nothing
// and is repeated, up to 6 times.
func TestE2EDedupSIGKILL(t *testing.T) {
	bin := buildShaper(t)
	try := func(window string, lostAcks func(killRun) int) killRun {
		var r killRun
		for i := range 6 {
			r = runKill(t, bin, window)
			t.Logf("dedup_window %s, run %d: %d distinct keys delivered, %d duplicate deliveries %v, %d duplicates skipped",
				window, i+1, r.distinct, r.duplicates, r.dupKeys, r.skipped)
			if r.distinct != 1000 || lostAcks(r) > 0 || t.Failed() {
				break
			}
		}
		return r
	}
	without := try("0s", func(r killRun) int { return r.duplicates })
	if without.duplicates == 0 {
		t.Fatalf("without dedup no run gave a duplicate: the scenario does not reproduce the lost acks")
	}
	if without.skipped != 0 {
		t.Errorf("without dedup %d duplicates skipped, want 0", without.skipped)
	}
	with := try("10m", func(r killRun) int { return r.skipped + r.duplicates })
	if with.skipped == 0 && with.duplicates == 0 {
		t.Fatalf("with dedup no run lost an ack: the scenario proved nothing")
	}
	if with.duplicates != 0 {
		t.Errorf("with dedup_window 10m the downstream got %d duplicate deliveries (%v), want 0", with.duplicates, with.dupKeys)
	}
	if with.distinct != 1000 || without.distinct != 1000 {
		t.Errorf("distinct keys delivered: %d without, %d with dedup; want 1000 (nothing lost)", without.distinct, with.distinct)
	}
	t.Logf("SIGKILL after 300 of 1,000 at 200/s: without dedup %d duplicates, with dedup_window 10m %d (%d skipped)",
		without.duplicates, with.duplicates, with.skipped)
}
