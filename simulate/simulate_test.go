package simulate

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

func lane(limit float64, capacity int, overflow string) config.Lane {
	return config.Lane{
		Bucket: config.Bucket{Capacity: capacity, Overflow: overflow},
		Rate:   config.Rate{Limit: shaper.Limit(limit), MinSpacing: 0.95, Warmup: config.Warmup{ColdFactor: 3}},
		Task:   config.Task{MaxInFlight: 8},
	}
}

// TestRunBurstAtRate: a burst leaves one interval apart from the first
// arrival, all of it, and the worst 1 s window is the G1 bound.
func TestRunBurstAtRate(t *testing.T) {
	res := Run(lane(50, 1000, config.OverflowBlock), Burst(200, 0, 0), Options{})
	if len(res.Departures) != 200 || len(res.DeadLetters) != 0 {
		t.Fatalf("%d departures, %d dead letters; want 200, 0", len(res.Departures), len(res.DeadLetters))
	}
	for i, d := range res.Departures {
		if want := time.Duration(i) * 20 * time.Millisecond; d.At != want {
			t.Fatalf("departure %d at %v, want %v", i, d.At, want)
		}
	}
	s := res.Summarize()
	if s.WorstWindow != 50 || s.Delivered != 200 {
		t.Errorf("worst 1 s window %d, delivered %d; want 50, 200", s.WorstWindow, s.Delivered)
	}
	if last := res.Depth[len(res.Depth)-1]; last.Depth != 0 {
		t.Errorf("depth at the end %d", last.Depth)
	}
}

// TestRunOverflowBlockAndReject: block keeps the backlog in the stream and
// delivers everything; reject dead-letters what finds the bucket full; with
// max_wait, what would wait too long.
func TestRunOverflowBlockAndReject(t *testing.T) {
	tr := Burst(100, 0, 0)
	if res := Run(lane(10, 20, config.OverflowBlock), tr, Options{}); len(res.Departures) != 100 {
		t.Errorf("block: %d delivered, want 100", len(res.Departures))
	}
	res := Run(lane(10, 20, config.OverflowReject), tr, Options{})
	if s := res.Summarize(); s.Delivered != 20 || s.DeadLetters[shaper.ReasonOverflow] != 80 {
		t.Errorf("reject: delivered %d, overflow %d; want 20, 80", s.Delivered, s.DeadLetters[shaper.ReasonOverflow])
	}
	cfg := lane(10, 100, config.OverflowReject)
	cfg.Bucket.MaxWait = time.Second
	res = Run(cfg, tr, Options{})
	if s := res.Summarize(); s.Delivered != 11 || s.DeadLetters[shaper.ReasonMaxWait] != 89 {
		t.Errorf("max_wait 1 s at 10/s: delivered %d, max_wait %d; want 11, 89", s.Delivered, s.DeadLetters[shaper.ReasonMaxWait])
	}
}

// TestRunMaxAge: at 10/s with max_age 2 s, a burst of 50 delivers what
// leaves within 2 s of arrival and dead-letters the rest as expired.
func TestRunMaxAge(t *testing.T) {
	cfg := lane(10, 100, config.OverflowBlock)
	cfg.Bucket.MaxAge = 2 * time.Second
	res := Run(cfg, Burst(50, 0, 0), Options{})
	s := res.Summarize()
	if s.Delivered != 21 || s.DeadLetters[shaper.ReasonExpired] != 29 {
		t.Errorf("delivered %d, expired %d; want 21 (0 s … 2 s), 29", s.Delivered, s.DeadLetters[shaper.ReasonExpired])
	}
	for _, d := range res.DeadLetters {
		if d.At > 2250*time.Millisecond {
			t.Errorf("expired at %v, want as it passed 2 s (the 250 ms sweep)", d.At)
		}
	}
}

// TestRunMaxAgeWhileBlocked: with the one task slot held by a 10 s sink
// call, the waiting messages are dead-lettered by the 250 ms sweep as they
// pass max_age, not when the slot frees.
func TestRunMaxAgeWhileBlocked(t *testing.T) {
	cfg := lane(10, 100, config.OverflowBlock)
	cfg.Bucket.MaxAge = 2 * time.Second
	cfg.Task.MaxInFlight = 1
	res := Run(cfg, Burst(5, 0, 0), Options{SinkLatency: 10 * time.Second})
	if len(res.DeadLetters) != 4 {
		t.Fatalf("%d dead letters, want 4", len(res.DeadLetters))
	}
	for _, d := range res.DeadLetters {
		if d.At < 2*time.Second || d.At > 2250*time.Millisecond {
			t.Errorf("expired at %v, want between 2 s and the next sweep", d.At)
		}
	}
}

// TestRunWarmup: a cold lane starts at limit / cold_factor.
func TestRunWarmup(t *testing.T) {
	cfg := lane(30, 1000, config.OverflowBlock)
	cfg.Rate.Warmup = config.Warmup{Period: 10 * time.Second, ColdFactor: 3}
	res := Run(cfg, Burst(600, 0, 0), Options{})
	rows := res.Seconds()
	if rows[0].Departed > 12 || rows[15].Departed != 30 {
		t.Errorf("departures in second 0: %d (want ≈ 10, cold), in second 15: %d (want 30)", rows[0].Departed, rows[15].Departed)
	}
}

// TestRunSinkLatencyAndSlots: with one slot and a sink call of 100 ms, a
// 50/s lane delivers 10/s.
func TestRunSinkLatencyAndSlots(t *testing.T) {
	cfg := lane(50, 1000, config.OverflowBlock)
	cfg.Task.MaxInFlight = 1
	res := Run(cfg, Burst(30, 0, 0), Options{SinkLatency: 100 * time.Millisecond})
	if d := res.Departures[29].At; d != 2900*time.Millisecond {
		t.Errorf("30th departure at %v, want 2.9 s", d)
	}
}

// TestRunFair: the simulator serves keys by round robin like the daemon's
// bucket: B's and C's trickle leaves within a round behind A's burst.
func TestRunFair(t *testing.T) {
	cfg := lane(50, 6000, config.OverflowBlock)
	cfg.Bucket.FairKey = "Tenant"
	var tr []Arrival
	for range 5000 {
		tr = append(tr, Arrival{Key: "A"})
	}
	for i := range 40 {
		at := time.Duration(i) * 500 * time.Millisecond
		tr = append(tr, Arrival{At: at, Key: "B"}, Arrival{At: at, Key: "C"})
	}
	res := Run(cfg, tr, Options{})
	for _, d := range res.Departures {
		if d.Key != "A" && d.Wait() > 60*time.Millisecond {
			t.Fatalf("%s waited %v, want ≤ 3 intervals", d.Key, d.Wait())
		}
	}
	cfg.Bucket.FairKey = ""
	res = Run(cfg, tr, Options{})
	if w := res.Summarize().P99Wait; w < 90*time.Second {
		t.Errorf("FIFO: p99 wait %v, want B and C behind the 100 s burst", w)
	}
}

// TestProperty: on random traces the departures keep G1 (1 s windows ≤
// limit + 1 with slack 0), every arrival is accounted for once, and the
// order within a key is kept.
func TestProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for run := range 30 {
		limit := float64(1 + r.IntN(100))
		cfg := lane(limit, 1+r.IntN(300), []string{config.OverflowBlock, config.OverflowReject}[r.IntN(2)])
		if r.IntN(2) == 0 {
			cfg.Bucket.FairKey = "subject:1"
		}
		var tr []Arrival
		for range r.IntN(500) {
			tr = append(tr, Arrival{At: time.Duration(r.Int64N(int64(20 * time.Second))), Key: string(rune('a' + r.IntN(4)))})
		}
		res := Run(cfg, tr, Options{SinkLatency: time.Duration(r.IntN(50)) * time.Millisecond})
		if got := len(res.Departures) + len(res.DeadLetters); got != len(tr) {
			t.Fatalf("seed %d run %d: %d departures + dead letters, want %d", seed, run, got, len(tr))
		}
		if s := res.Summarize(); s.WorstWindow > int(limit)+1 {
			t.Fatalf("seed %d run %d: %d in a 1 s window at %g/s", seed, run, s.WorstWindow, limit)
		}
		last := map[string]time.Duration{}
		for _, d := range res.Departures {
			if d.Arrived < last[d.Key] {
				t.Fatalf("seed %d run %d: key %s out of order", seed, run, d.Key)
			}
			last[d.Key] = d.Arrived
		}
	}
}

func TestReadTrace(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"csv", "0,A\n0.5,B\n\n1.25\n", "[0s/A 500ms/B 1.25s/]"},
		{"csv header", "time_offset_seconds,key\n2,x\n", "[2s/x]"},
		{"json lines", "{\"at\": 0.1, \"key\": \"k\"}\n\n{\"at\": 3}\n", "[100ms/k 3s/]"},
	} {
		got, err := ReadTrace(strings.NewReader(c.in))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var s []string
		for _, a := range got {
			s = append(s, fmt.Sprintf("%v/%s", a.At, a.Key))
		}
		if fmt.Sprint(s) != c.want {
			t.Errorf("%s: %v, want %s", c.name, s, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"0\n-1\n", "line 2"}, {"0\nsoon\n", "line 2"}, {"{\"at\": 1}\n{\"key\": \"a\"}\n", `line 2: no "at"`},
		{"{\"at\": -2}\n", "line 1"}, {"{\"at\": 1\n", "line 1"},
	} {
		if _, err := ReadTrace(strings.NewReader(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error naming %s", c.in, err, c.want)
		}
	}
}

// TestSVGStructure is the SVG golden test of structure, not pixels: an svg
// root; the axes with ticks and labels; the three series with points; a
// legend naming each series.
func TestSVGStructure(t *testing.T) {
	res := Run(lane(50, 1000, config.OverflowBlock), Burst(300, 20, 10*time.Second), Options{})
	var buf bytes.Buffer
	if err := res.WriteSVG(&buf, "test <&>"); err != nil {
		t.Fatal(err)
	}
	type node struct {
		XMLName xml.Name
		Attrs   []xml.Attr `xml:",any,attr"`
		Text    string     `xml:",chardata"`
		Nodes   []node     `xml:",any"`
	}
	var root node
	if err := xml.Unmarshal(buf.Bytes(), &root); err != nil {
		t.Fatalf("not well-formed XML: %v", err)
	}
	if root.XMLName.Local != "svg" || root.XMLName.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("root %v, want svg in the SVG namespace", root.XMLName)
	}
	attr := func(n node, name string) string {
		for _, a := range n.Attrs {
			if a.Name.Local == name {
				return a.Value
			}
		}
		return ""
	}
	byID := map[string]node{}
	var walk func(n node)
	walk = func(n node) {
		if id := attr(n, "id"); id != "" {
			byID[id] = n
		}
		for _, c := range n.Nodes {
			walk(c)
		}
	}
	walk(root)
	count := func(n node, local string) (k int, texts []string) {
		var f func(n node)
		f = func(n node) {
			if n.XMLName.Local == local {
				k++
				texts = append(texts, strings.TrimSpace(n.Text))
			}
			for _, c := range n.Nodes {
				f(c)
			}
		}
		f(n)
		return
	}
	for _, ax := range []string{"x-axis", "y-axis", "y2-axis"} {
		n, ok := byID[ax]
		if !ok {
			t.Errorf("no %s", ax)
			continue
		}
		lines, _ := count(n, "line")
		labels, texts := count(n, "text")
		if lines < 4 || labels < 4 {
			t.Errorf("%s: %d lines, %d labels; want an axis with ≥ 3 ticks, each labelled, and a title (%v)", ax, lines, labels, texts)
		}
	}
	for _, s := range []string{"arrivals", "departures", "depth"} {
		n, ok := byID[s]
		if !ok || n.XMLName.Local != "polyline" || len(strings.Fields(attr(n, "points"))) < 10 {
			t.Errorf("series %s missing or empty", s)
		}
	}
	legend, ok := byID["legend"]
	_, texts := count(legend, "text")
	if !ok || len(texts) != 3 || !strings.Contains(strings.Join(texts, "|"), "arrivals") ||
		!strings.Contains(strings.Join(texts, "|"), "departures") || !strings.Contains(strings.Join(texts, "|"), "depth") {
		t.Errorf("legend %v, want the three series", texts)
	}
	if !strings.Contains(buf.String(), "test &lt;&amp;&gt;") {
		t.Error("title not escaped")
	}
}

// TestPercentileNearestRank: the report's p50 and p99 follow the
// nearest-rank definition, so a second with two waits shows the lower as its
// p50 (a new-user pass saw the upper), and the p99 of 100 waits is the 99th,
// not the largest.
func TestPercentileNearestRank(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		w := make([]time.Duration, len(v))
		for i, x := range v {
			w[i] = time.Duration(x) * time.Millisecond
		}
		return w
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // unsorted on purpose
	}
	for _, tc := range []struct {
		w    []time.Duration
		p    int
		want time.Duration
	}{
		{ms(7), 50, 7 * time.Millisecond},
		{ms(9, 3), 50, 3 * time.Millisecond},
		{ms(9, 3), 99, 9 * time.Millisecond},
		{ms(1, 2, 3), 50, 2 * time.Millisecond},
		{ms(hundred...), 50, 50 * time.Millisecond},
		{ms(hundred...), 99, 99 * time.Millisecond},
		{ms(hundred...), 100, 100 * time.Millisecond},
	} {
		if got := percentile(tc.w, tc.p); got != tc.want {
			t.Errorf("percentile(%v, %d) = %v, want %v", tc.w, tc.p, got, tc.want)
		}
	}
}
