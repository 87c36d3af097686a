package main

import (
	"strings"
	"testing"
)

// TestLargeRowHolds: a large-payload cell holds only with every message
// delivered, no slow-consumer error, no disconnection and a peak RSS within
// capacity × 512 KiB + 64 MiB; the headline says so from the numbers.
func TestLargeRowHolds(t *testing.T) {
	ok := largeRow{Msgs: 400, Capacity: 20, Delivered: 400, PeakRSS: 74 << 20}
	if !ok.holds() {
		t.Fatalf("%+v does not hold, bound %d", ok, ok.bound())
	}
	for name, r := range map[string]largeRow{
		"over the bound": {Msgs: 400, Capacity: 20, Delivered: 400, PeakRSS: 74<<20 + 1},
		"slow consumer":  {Msgs: 400, Capacity: 20, Delivered: 400, PeakRSS: 1, Slow: 1},
		"disconnected":   {Msgs: 400, Capacity: 20, Delivered: 400, PeakRSS: 1, Disconnects: 1},
		"one missing":    {Msgs: 400, Capacity: 20, Delivered: 399, PeakRSS: 1},
		"not measured":   {Msgs: 400, Capacity: 20, Delivered: 400},
		"failed":         {Msgs: 400, Capacity: 20, Delivered: 400, PeakRSS: 1, Err: "x"},
	} {
		if r.holds() {
			t.Errorf("%s: %+v holds", name, r)
		}
		res := &Results{large: []largeRow{r}}
		if h := res.memoryHeadlines(); len(h) != 1 || !strings.Contains(h[0], "does not hold") {
			t.Errorf("%s: headline %q", name, h)
		}
	}
	res := &Results{mem: []memoryRow{{name: "x", n: 1, perMsg: memBound + 1}, {name: "y", n: 1, perMsg: memBound}}}
	h := res.memoryHeadlines()
	if !strings.Contains(h[0], "does not hold") || !strings.Contains(h[1], "(holds)") {
		t.Errorf("heap headlines %q", h)
	}
}
