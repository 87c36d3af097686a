package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Field case C31: a hot reload under the ways files really change — an
// in-place truncate-then-write, a half-written file held for seconds, an
// editor's rename, a burst of writes, a lane added and removed, and the
// Kubernetes ConfigMap swap of the ..data link. The numbers are the case's.
// The windows are counted at the downstream on kernel receive timestamps.

// c31Config renders the config of the case: lane a at limitA (capacity
// 500), and lane b (2/s, subject c31.b.>) when withB.
func c31Config(natsAddr, store, admin, aURL, limitA, bURL string, withB bool) string {
	s := fmt.Sprintf(`
nats: { url: "", embedded: { listen: %q, store_dir: %q } }
admin: { listen: %q }
shutdown: { drain_timeout: 2s }
downstreams:
  a:
    source: { stream: C31_A, subjects: ["c31.a.>"] }
    bucket: { capacity: 500 }
    rate: { limit: %s }
    sink: { kind: http, url: %q }
`, natsAddr, store, admin, limitA, aURL)
	if withB {
		s += fmt.Sprintf(`  b:
    source: { stream: C31_B, subjects: ["c31.b.>"] }
    rate: { limit: 2/s }
    sink: { kind: http, url: %q }
`, bURL)
	}
	return s
}

// c31Scraper scrapes /metrics every 100 ms for the whole run and records
// what the case forbids: lane a's rate at 0, NaN or a value never
// configured, and its departures counter going down.
type c31Scraper struct {
	mu          sync.Mutex
	rates       map[float64]int // rate of lane a -> scrapes that saw it
	lastDeps    float64
	decreases   []string
	scrapes     int
	stop, done  chan struct{}
	latest      []sample // the latest scrape
	scrapeError string   // of the last failed scrape
}

func startC31Scraper(t *testing.T, admin string) *c31Scraper {
	s := &c31Scraper{rates: map[float64]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			code, body, err := httpGet("http://" + admin + "/metrics")
			if err != nil || code != 200 {
				s.mu.Lock()
				s.scrapeError = fmt.Sprintf("code %d, %v", code, err)
				s.mu.Unlock()
				continue
			}
			samples, err := parseMetrics(body)
			s.mu.Lock()
			if err != nil {
				s.scrapeError = err.Error()
				s.mu.Unlock()
				continue
			}
			s.scrapes++
			s.latest = samples
			for _, x := range samples {
				if x.labels["lane"] != "a" {
					continue
				}
				switch x.name {
				case "shaper_rate_limit_per_second":
					s.rates[x.value]++
				case "shaper_departures_total":
					if x.value < s.lastDeps {
						s.decreases = append(s.decreases, fmt.Sprintf("%v after %v", x.value, s.lastDeps))
					}
					s.lastDeps = x.value
				}
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *c31Scraper) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// seriesOf returns the series of the latest scrape that carry lane=lane,
// each as its name and its other labels.
func (s *c31Scraper) seriesOf(lane string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, x := range s.latest {
		if x.labels["lane"] != lane {
			continue
		}
		var ls []string
		for k, v := range x.labels {
			if k != "lane" && k != "le" { // a histogram's buckets follow the lane's rate
				ls = append(ls, k+"="+v)
			}
		}
		slices.Sort(ls)
		out[x.name+"{"+strings.Join(ls, ",")+"}"] = true
	}
	return out
}

// fresh waits for a scrape made after now.
func (s *c31Scraper) fresh() {
	s.mu.Lock()
	n := s.scrapes
	s.mu.Unlock()
	for {
		time.Sleep(20 * time.Millisecond)
		s.mu.Lock()
		m := s.scrapes
		s.mu.Unlock()
		if m >= n+2 {
			return
		}
	}
}

// windowCounts returns the fewest and the most arrivals of ts (sorted) in a
// half-open window [s, s+w) over the starts s from t0+from to t0+to, in
// steps of 10 ms.
func windowCounts(ts []time.Time, t0 time.Time, from, to float64, w time.Duration) (lo, hi int) {
	lo = math.MaxInt
	cmp := func(x, y time.Time) int { return x.Compare(y) }
	for s := from; s <= to+1e-9; s += 0.01 {
		start := t0.Add(time.Duration(s * float64(time.Second)))
		i, _ := slices.BinarySearchFunc(ts, start, cmp)
		j, _ := slices.BinarySearchFunc(ts, start.Add(w), cmp)
		lo, hi = min(lo, j-i), max(hi, j-i)
	}
	return lo, hi
}

// checkWindows fails the test unless every 1 s window starting from t0+from
// to t0+to holds between lo and hi arrivals.
func checkWindows(t *testing.T, what string, ts []time.Time, t0 time.Time, from, to float64, lo, hi int) {
	t.Helper()
	gotLo, gotHi := windowCounts(ts, t0, from, to, time.Second)
	if gotLo < lo || gotHi > hi {
		t.Errorf("%s: 1 s windows starting in [%.1f, %.1f] s hold %d to %d arrivals, want %d to %d",
			what, from, to, gotLo, gotHi, lo, hi)
	}
}

// sleepUntil sleeps until t0+at seconds.
func sleepUntil(t0 time.Time, at float64) {
	time.Sleep(time.Until(t0.Add(time.Duration(at * float64(time.Second)))))
}

// TestCase_C31_ReloadUnderRealFileWrites runs the case's two runs side by
// side: a plain file (45 s) and the Kubernetes layout (10 s).
func TestCase_C31_ReloadUnderRealFileWrites(t *testing.T) {
	bin := buildShaper(t)
	t.Run("plain file", func(t *testing.T) {
		t.Parallel()
		c31PlainFile(t, bin)
	})
	t.Run("configmap", func(t *testing.T) {
		t.Parallel()
		c31ConfigMap(t, bin)
	})
}

// c31PlainFile is the case's run 1.
func c31PlainFile(t *testing.T, bin string) {
	downA, downB := newDownstream(t, nil), newDownstream(t, nil)
	natsAddr, admin := freeAddr(t), freeAddr(t)
	store := filepath.Join(t.TempDir(), "nats")
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	cfg := func(limitA string, withB bool) string {
		return c31Config(natsAddr, store, admin, downA.url(), limitA, downB.url(), withB)
	}
	// The time each in-place write left the file empty, between its
	// truncate and its write: this process, too, can be descheduled in
	// between, and a file that stays empty for longer than the daemon's
	// wait for the write (1 s after the 200 ms debounce) is rightly
	// rejected as empty.
	// Each span is known between bounds: from after the truncating open
	// to before the write (at least), from before it to after (at most).
	type span struct{ least, most time.Duration }
	var emptyFor []span
	inPlace := func(body string) { // truncate and write, as `>` in a shell does
		t.Helper()
		before := time.Now()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		truncated := time.Now()
		if _, err := f.WriteString(body); err != nil {
			t.Fatal(err)
		}
		if body != "" {
			emptyFor = append(emptyFor, span{time.Since(truncated), time.Since(before)})
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	renamed := 0
	mv := func(body string) { // write a new file, then mv it over the config
		t.Helper()
		renamed++
		tmp := filepath.Join(dir, fmt.Sprintf("new%d.yaml", renamed))
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	inPlace(cfg("20/s", false))
	c := startChild(t, bin, "run", "-c", path)
	waitReady(t, admin, 15*time.Second)
	js := connectJS(t, "nats://"+natsAddr)
	// Lane b's stream exists before the lane does, with 20 messages waiting.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "C31_B", Subjects: []string{"c31.b.>"}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	keysB := publishBurst(t, js, "c31.b.job", 20)
	publishBurst(t, js, "c31.a.job", 1500)
	scr := startC31Scraper(t, admin)
	t0 := time.Now()

	// t=5: `: > config.yaml`, 300 ms, then the whole file at 10/s.
	sleepUntil(t0, 5)
	inPlace("")
	time.Sleep(300 * time.Millisecond)
	inPlace(cfg("10/s", false))
	// t=10: the first half of the file (a YAML syntax error) for 3 s, then all of it.
	sleepUntil(t0, 10)
	full := cfg("10/s", false)
	half := full[:strings.Index(full, "rate:")+len("rate: { lim")]
	inPlace(half)
	time.Sleep(3 * time.Second)
	inPlace(full)
	// t=15 and t=20: mv over the file, 5/s then 8/s.
	sleepUntil(t0, 15)
	mv(cfg("5/s", false))
	sleepUntil(t0, 20)
	mv(cfg("8/s", false))
	// t=30: 50 writes within 1 s, alternating 7/s and 6/s, ending at 6/s.
	sleepUntil(t0, 30)
	for i := range 50 {
		limit := "7/s"
		if i%2 == 1 {
			limit = "6/s"
		}
		inPlace(cfg(limit, false))
		time.Sleep(19 * time.Millisecond)
	}
	// When this process was descheduled during the burst it ended later
	// than t=31: the windows after it count from its real end.
	burstEnd := time.Since(t0).Seconds()
	// t=35: lane b is added; within 1 s every series lane a has exists for b.
	sleepUntil(t0, 35)
	inPlace(cfg("6/s", true))
	addedAt := time.Now()
	var missing []string
	for {
		scr.fresh()
		a, b := scr.seriesOf("a"), scr.seriesOf("b")
		missing = missing[:0]
		for k := range a {
			if !b[k] {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 || time.Since(addedAt) > 1500*time.Millisecond {
			break
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("1.5 s after lane b was added (1 s in the case, plus the 200 ms debounce and a scrape), lane a's series missing for b: %v", missing)
	} else {
		t.Logf("lane b's series all present %s after the write", time.Since(addedAt).Round(time.Millisecond))
	}
	// t=42: lane b is removed; its series leave /metrics within 2 s, and its
	// consumer holds nothing unacknowledged within 3 s.
	sleepUntil(t0, 42)
	inPlace(cfg("6/s", false))
	removedAt := time.Now()
	for {
		scr.fresh()
		if len(scr.seriesOf("b")) == 0 {
			t.Logf("lane b's series gone %s after the write", time.Since(removedAt).Round(time.Millisecond))
			break
		}
		if time.Since(removedAt) > 2*time.Second {
			t.Errorf("lane b's series still in /metrics 2 s after it was removed: %d of them", len(scr.seriesOf("b")))
			break
		}
	}
	// The removed lane drains (shutdown.drain_timeout, 2 s here) and naks
	// what it still holds. nats-server keeps a nak'd message in the
	// consumer's ack-pending set until it is delivered again, so the case's
	// "NumAckPending 0 within 3 s" is checked as: within 3 s every message
	// of b not delivered can be fetched again from b's consumer, and after
	// those are acked NumAckPending is 0. None is lost.
	c31NoneLost(t, js, "C31_B", "shaper-b", keysB, downB, removedAt, 3*time.Second)
	if n := c31AckPending(t, js, "C31_B", "shaper-b"); n != 0 {
		t.Errorf("lane b's consumer has %d unacknowledged messages after the handback was fetched and acked, want 0", n)
	}
	// t=45 (beyond the case): the file truncated and left empty. A change
	// that empties the file waits 1 s for the write to finish (the
	// truncate-then-writes above were never rejected); one that stays
	// empty is rejected once.
	sleepUntil(t0, 45)
	inPlace("")
	time.Sleep(200*time.Millisecond + time.Second + 400*time.Millisecond)
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if code, ok := c.wait(15 * time.Second); !ok || code != 0 {
		t.Errorf("exit code %d (exited: %v), want 0", code, ok)
	}
	scr.close()

	arr, _ := downA.snapshot()
	ts := times(arr)
	// The case's windows, at the downstream.
	checkWindows(t, "t=5 truncate-then-write", ts, t0, 5, 5.3, 0, 21)
	checkWindows(t, "10/s within 1 s of the complete write", ts, t0, 6.4, 9, 9, 11)
	checkWindows(t, "10/s kept through the half-written file", ts, t0, 10, 12.9, 9, 11)
	checkWindows(t, "5/s after the first mv", ts, t0, 16, 19, 4, 6)
	checkWindows(t, "8/s after the second mv (the watcher survived the first)", ts, t0, 21, 24, 7, 9)
	// The case asks for at most 8 here, as if the first write of the burst
	// applied at once. The file watch applies a burst once, 200 ms after its
	// last write, so the lane is still at 8/s through the burst, and SPEC G1
	// (and the case's own "never above max(old, new) + 1") allow 8 + 1.
	checkWindows(t, "the write burst", ts, t0, 30, burstEnd, 0, 9)
	checkWindows(t, "6/s within 1 s of the last write", ts, t0, max(32.1, burstEnd+1.1), 44, 5, 7)
	if burstEnd > 31.5 {
		t.Logf("the burst of 50 writes ended at t=%.2f s, not about 31 (this process was descheduled)", burstEnd)
	}
	// Lane b departed at 2/s while it ran.
	arrB, _ := downB.snapshot()
	tsB := times(arrB)
	checkWindows(t, "lane b at 2/s", tsB, addedAt.Add(time.Second), 0, 5, 1, 3)

	// Never a rate of 0, NaN or a value nobody configured.
	scr.mu.Lock()
	for r, n := range scr.rates {
		if !slices.Contains([]float64{20, 10, 5, 8, 7, 6}, r) {
			t.Errorf("shaper_rate_limit_per_second{lane=a} was %v in %d scrapes: never configured", r, n)
		}
	}
	if len(scr.decreases) > 0 {
		t.Errorf("shaper_departures_total{lane=a} went down: %v (the registry was rebuilt)", scr.decreases)
	}
	lastDeps := scr.lastDeps
	scr.mu.Unlock()
	if d := math.Abs(lastDeps - float64(len(ts))); d > 4 {
		t.Errorf("shaper_departures_total{lane=a} %v at the last scrape, the downstream saw %d", lastDeps, len(ts))
	}

	logs := c.stderrText()
	// The case allows at most one line for the empty read at t=5; shaper
	// waits for the write and logs none for it, nor for the burst at t=30
	// (a debounce that ends between a truncate and its write), and one for
	// the file left empty at t=45.
	// (Plus one for each write that left the file empty longer than the
	// wait: then this process stalled between truncate and write.)
	const wait = 200*time.Millisecond + time.Second
	surely, maybe, longest := 0, 0, time.Duration(0)
	for _, d := range emptyFor {
		longest = max(longest, d.most)
		if d.least > wait {
			surely++
		}
		if d.most > wait {
			maybe++
		}
	}
	t.Logf("in-place writes left the file empty for up to %v between truncate and write (the test's own 300 ms at t=5 aside)", longest)
	if n := strings.Count(logs, "is empty"); n < 1+surely || n > 1+maybe {
		t.Errorf("%d log lines about the empty file, want 1 for the file left empty at t=45, plus one for each write that left it empty for more than 1.2 s (%d to %d), none for the other truncate-then-writes; longest %v", n, surely, maybe, longest)
	}
	if !strings.Contains(logs, "reload rejected") || !strings.Contains(logs, path) {
		t.Errorf("no reload rejection naming %s in the logs", path)
	}
	for _, bad := range []string{"fatal error", "panic:", "concurrent map"} {
		if strings.Contains(logs, bad) {
			t.Errorf("the logs hold %q", bad)
		}
	}
}

// c31AckPending returns the consumer's NumAckPending.
func c31AckPending(t *testing.T, js jetstream.JetStream, stream, consumer string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.NumAckPending
}

// c31NoneLost fetches (and acks) what is left on the durable consumer and
// checks that it and what down received are all of keys, by from+within.
func c31NoneLost(t *testing.T, js jetstream.JetStream, stream, consumer string, keys []string, down *downstream, from time.Time, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), from.Add(within))
	defer cancel()
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for _, k := range keys {
		if down.attemptsOf(k) == 0 {
			left[k] = true
		}
	}
	got := 0
	for len(left) > 0 {
		for k := range left { // delivered by the lane while it drained
			if down.attemptsOf(k) > 0 {
				delete(left, k)
			}
		}
		if len(left) == 0 {
			break
		}
		wait := time.Until(from.Add(within))
		if wait < 100*time.Millisecond {
			break
		}
		batch, err := cons.Fetch(len(left), jetstream.FetchMaxWait(min(wait, 250*time.Millisecond)))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			delete(left, m.Headers().Get(jetstream.MsgIDHeader))
			got++
			_ = m.Ack()
		}
	}
	if len(left) > 0 && !c31Delivered(left, down) {
		t.Errorf("lane b: %d messages neither delivered nor handed back %s after the lane was removed: %v", len(left), within, left)
	} else {
		t.Logf("lane b: %d delivered, %d handed back and fetched again, %s after the lane was removed", len(keys)-got, got, time.Since(from).Round(time.Millisecond))
	}
	time.Sleep(100 * time.Millisecond) // the acks are fire-and-forget
}

// c31Delivered reports whether down has seen every key of left.
func c31Delivered(left map[string]bool, down *downstream) bool {
	for k := range left {
		if down.attemptsOf(k) == 0 {
			return false
		}
	}
	return true
}

// c31ConfigMap is the case's run 2: the kubelet's swap of the ..data link.
func c31ConfigMap(t *testing.T, bin string) {
	downA := newDownstream(t, nil)
	natsAddr, admin := freeAddr(t), freeAddr(t)
	store := filepath.Join(t.TempDir(), "nats")
	dir := t.TempDir()
	version := func(name, limit string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		body := c31Config(natsAddr, store, admin, downA.url(), limit, "", false)
		if err := os.WriteFile(filepath.Join(dir, name, "config.yaml"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The kubelet's way: a new directory, a ..data_tmp link to it, renamed
	// over ..data.
	swap := func(name string) {
		t.Helper()
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "10/s")
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.yaml")
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), path); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, bin, "run", "-c", path)
	waitReady(t, admin, 15*time.Second)
	js := connectJS(t, "nats://"+natsAddr)
	publishBurst(t, js, "c31.a.job", 300)
	t0 := time.Now()
	version("..v2", "12/s")
	version("..v3", "15/s")
	sleepUntil(t0, 3)
	swap("..v2")
	sleepUntil(t0, 6)
	swap("..v3")
	sleepUntil(t0, 10)
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if code, ok := c.wait(15 * time.Second); !ok || code != 0 {
		t.Errorf("exit code %d (exited: %v), want 0", code, ok)
	}
	arr, _ := downA.snapshot()
	ts := times(arr)
	checkWindows(t, "12/s after the first swap", ts, t0, 4.5, 5, 11, 13)
	checkWindows(t, "15/s after the second swap", ts, t0, 7.5, 9, 14, 16)
}

// TestReloadWaitsOutEmptyFile: a change that leaves the config file empty
// waits for the write; while writes go on (here: the file empty 45 ms and
// written 5 ms, over and over for 2 s, longer than the 1 s wait), the wait
// goes on too, and the file written last is applied: no rejection, and
// the rate of the last write in force.
func TestReloadWaitsOutEmptyFile(t *testing.T) {
	bin := buildShaper(t)
	down := newDownstream(t, nil)
	natsAddr, admin := freeAddr(t), freeAddr(t)
	store := filepath.Join(t.TempDir(), "nats")
	path := filepath.Join(t.TempDir(), "config.yaml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(c31Config(natsAddr, store, admin, down.url(), "20/s", "", false))
	c := startChild(t, bin, "run", "-c", path)
	waitReady(t, admin, 15*time.Second)
	write("")
	time.Sleep(300 * time.Millisecond) // the change is seen, the file empty: the wait begins
	full := c31Config(natsAddr, store, admin, down.url(), "7/s", "", false)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		write("")
		time.Sleep(45 * time.Millisecond)
		write(full)
		time.Sleep(5 * time.Millisecond)
	}
	// The last write's change comes 200 ms after it: wait for it to be
	// applied (or 10 s), not a fixed time.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(c.stderrText(), "limit=7/s") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	stopShaper(t, c, 10*time.Second)
	logs := c.stderrText()
	if n := strings.Count(logs, "is empty"); n != 0 {
		t.Errorf("%d rejections of the empty file while it was being written, want 0", n)
	}
	if !strings.Contains(logs, "limit=7/s") {
		t.Errorf("the file written last (7/s) was not applied:\n%s", logs)
	}
}
