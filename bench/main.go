// Command bench measures shaper against what users would pick instead —
// golang.org/x/time/rate, go.uber.org/ratelimit, a time.Ticker loop, a bare
// nats.go pull consumer — side by side in one run on one machine, and writes
// the tables to docs/BENCHMARKS.md (issue 7).
//
//	go run ./bench            # full run, about 10 minutes on 2 cores
//	go run ./bench -quick     # under a minute; CI runs it (TestBenchQuick)
//	go run ./bench -out FILE  # write the report elsewhere
//	go run ./bench -section cpu [-cpuprofile FILE]
//	                          # section 7 alone, on stdout only (and a CPU profile)
//	go run ./bench -section http [-quick] [-cpuprofile FILE]
//	                          # section 11 alone (the HTTP sink at 5,000/s)
//	go run ./bench -section idle|lanes|redis [-quick]
//	                          # section 9, 10 or 6 alone, on stdout only
//	go run ./bench -section memory [-memprofile FILE]
//	                          # section 5 alone, on stdout only (and a heap profile
//	                          # taken while the JetStream-fed bucket is full)
//	go run ./bench -section throughput|e2e [-rate R] [-cpuprofile FILE]
//	                          # section 3 or 4 alone (4 at rate R only), on stdout only
//
// It prints the same Markdown on stdout and its progress on stderr. A full
// run also measures what the machine itself takes from running threads, at
// its start and its end (stalls.go), and prints it in the run table.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run parses the flags, runs the benchmark and writes the report; it returns
// the exit code. Its length is the flag set and the report's outputs in one
// place, as a command's main reads.
func run(args []string, stdout, stderr io.Writer) int {
	if os.Getenv(envHTTPDownstream) == "1" { // section 11's downstream process
		return serveHTTPDownstream(os.Stdin, stdout)
	}
	if span := os.Getenv(envStallProbe); span != "" { // the stall probe's process (stalls.go)
		return stallChild(span, stdout)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "short run (under 60 s) for CI: fewer departures and messages")
	out := fs.String("out", "", "where to write the report (default docs/BENCHMARKS.md of the module)")
	section := fs.String("section", "", "run one section alone and print it without writing the report: cpu (section 7), throughput (3), e2e (4), memory (5), http (11), redis (6), idle (9), lanes (10)")
	rate := fs.Float64("rate", 0, "with -section e2e: measure section 4 at this rate (messages per second) only")
	msgs := fs.Int("msgs", 0, "with -section e2e -rate: messages of the stream (default: a few seconds' worth)")
	only := fs.String("only", "", "with -section e2e or throughput: run only the contenders whose name contains this")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run (runtime/pprof) to this file; with -section e2e, one per row: FILE-<rate>-<row>.prof")
	largeChildArg := fs.String("large-child", "", "internal: run one large-payload cell of section 5 (JSON) and print its result")
	memprofile := fs.String("memprofile", "", "with -section memory: write a heap profile (every allocation sampled) taken while the JetStream-fed bucket is full; with -section throughput: an allocation profile of the run (go tool pprof -sample_index=alloc_objects)")
	var prof string
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *largeChildArg != "" {
		return largeChild(*largeChildArg, stdout)
	}
	switch *section {
	case "", "cpu", "throughput", "e2e", "http", "memory":
	default:
		if !issue15Section(*section) {
			fmt.Fprintf(stderr, "bench: unknown section %q (cpu, throughput, e2e, memory, http, idle, lanes, redis)\n", *section)
			return 2
		}
	}
	if *msgs < 0 || (*msgs > 0 && *rate == 0) || (*only != "" && *section != "e2e" && *section != "throughput") {
		fmt.Fprintln(stderr, "bench: -msgs needs -rate, and -only needs -section e2e or throughput")
		return 2
	}
	if *rate < 0 || (*rate > 0 && *section != "e2e") {
		fmt.Fprintln(stderr, "bench: -rate needs -section e2e and a positive rate")
		return 2
	}
	if *memprofile != "" && *section != "memory" && *section != "throughput" {
		fmt.Fprintln(stderr, "bench: -memprofile needs -section memory or throughput")
		return 2
	}
	if *section == "memory" {
		return runMemoryOnly(*quick, *memprofile, stdout, stderr)
	}
	if *cpuprofile != "" && *section == "e2e" {
		// One profile per row (e2e.go), so that each contender's can be read alone.
		prof = *cpuprofile
	} else if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	if issue15Section(*section) {
		return runSection(*section, *quick, stdout, stderr) // issue15.go
	}
	if *section == "cpu" || *section == "http" {
		res, err := Run(Options{Quick: *quick, OnlyCPU: *section == "cpu", OnlyHTTP: *section == "http", Progress: stderr})
		if err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		md, hs := res.cpuMarkdown(), res.cpuHeadlines()
		if *section == "http" {
			md, hs = res.httpMarkdown(), res.httpHeadlines()
		}
		fmt.Fprint(stdout, md)
		for _, h := range hs {
			fmt.Fprintln(stdout, "- "+h)
		}
		for _, pr := range res.problems {
			fmt.Fprintln(stderr, "bench:", pr)
		}
		if len(res.problems) > 0 {
			return 1
		}
		return 0
	}
	if *memprofile != "" && *section == "throughput" {
		// An allocation profile of the run: which calls allocate per message.
		runtime.MemProfileRate = 4096
		defer writeAllocProfile(*memprofile, stderr)
	}
	if *section == "throughput" || *section == "e2e" {
		opts := Options{Quick: *quick, Section: *section, Progress: stderr, RowProfile: prof}
		if *rate > 0 {
			opts.FixedRates = []float64{*rate}
		}
		opts.FixedMsgs, opts.OnlyRows = *msgs, *only
		res, err := Run(opts)
		if err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		fmt.Fprint(stdout, res.e2eMarkdown())
		for _, pr := range res.problems {
			fmt.Fprintln(stderr, "bench:", pr)
		}
		if len(res.problems) > 0 {
			return 1
		}
		return 0
	}
	path := *out
	if path == "" {
		root, err := moduleRoot()
		if err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		path = filepath.Join(root, "docs", "BENCHMARKS.md")
	}
	cmd := "go run ./bench"
	if len(args) > 0 {
		cmd += " " + strings.Join(args, " ")
	}
	res, err := Run(Options{Quick: *quick, Command: cmd, Progress: stderr})
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	md := res.Markdown()
	fmt.Fprint(stdout, md)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	fmt.Fprintf(stderr, "bench: wrote %s (%s)\n", path, res.took.Round(100_000_000))
	if len(res.problems) > 0 {
		fmt.Fprintf(stderr, "bench: %d measurement(s) failed, see the report\n", len(res.problems))
		return 1
	}
	return 0
}

// moduleRoot walks up from the working directory to the directory holding
// go.mod, so that `go run .` inside bench/ writes the same file.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s: pass -out", dir)
		}
	}
}

// writeAllocProfile writes the allocation profile of the run so far to path
// (-section throughput -memprofile).
func writeAllocProfile(path string, stderr io.Writer) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		f.Close()
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
	}
}
