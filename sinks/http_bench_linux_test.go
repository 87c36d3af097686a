//go:build linux

package sinks_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
)

// BenchmarkHTTPSend measures one Send of the HTTP sink with the lane's wire
// report, one at a time, to the stamped downstream process (a process of its
// own, so the allocations and the CPU reported are the sending side's only):
//
//	go test -run '^$' -bench HTTPSend -benchmem ./sinks/
//
// cpu-µs/op is the process's user + system time per Send (getrusage), which
// counts the transport's goroutines and the runtime too (issue 15).
func BenchmarkHTTPSend(b *testing.B) {
	down := startStampedHTTPProcess(b)
	sink, err := sinks.NewHTTP(sinks.HTTPConfig{URL: down.URL(), Headers: map[string]string{"Content-Type": "application/json"}})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	body := make([]byte, 256)
	var wired int
	ctx := shaper.WithWire(context.Background(), func(time.Time, bool) { wired++ })
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		m := &shaper.Message{Subject: "mem.jobs", Header: map[string][]string{shaper.MsgIDHeader: {"job-" + strconv.Itoa(i)}},
			Data: body, Stream: "MEM", StreamSeq: uint64(i + 1), NumDelivered: 1}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := sink.Send(tctx, m); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	if wired != b.N {
		b.Fatalf("%d wire reports for %d sends", wired, b.N)
	}
}
