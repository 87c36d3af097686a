package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/simulate"
)

// simulateCmd is `shaper simulate` (SPEC §5): a lane's own rules on a
// virtual clock against a trace or a synthetic burst (package simulate).
// Long because each flag and its check is a line of its own.
func simulateCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		lane, trace, svg string
		burst            int
		trickle          float64
		dur, latency     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "simulate --lane LANE (--trace FILE | --burst N [--trickle RATE --for D] | --trickle RATE --for D) [--svg FILE]",
		Short: "Run a lane's rules on a virtual clock against a trace; print the per-second table and a summary",
		Long: `Runs the lane's own pacer, bucket (fairness included), overflow, max_wait, max_age,
warmup, quota and max_in_flight on a virtual clock, with no NATS and no sink, against a
recorded trace (CSV "time_offset_seconds[,key]" or JSON lines {"at": seconds, "key": "..."})
or a synthetic burst. Prints the per-second table and a summary; --svg draws arrivals,
departures and bucket depth over time.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			usage := func(format string, a ...any) error {
				return &exitError{code: exitUsage, err: fmt.Errorf("simulate: "+format, a...)}
			}
			// A synthetic trace is a burst, a trickle, or a burst then a
			// trickle (a new-user pass found --trickle alone refused).
			if synthetic := burst != 0 || trickle != 0; (trace == "") == !synthetic {
				return usage("give one of --trace FILE, --burst N or --trickle RATE --for D")
			}
			if burst < 0 || trickle < 0 || dur < 0 || latency < 0 {
				return usage("--burst, --trickle, --for and --sink-latency must be ≥ 0")
			}
			if (trickle > 0) != (dur > 0) {
				return usage("--trickle RATE and --for D go together")
			}
			// simulate reaches no server: the sink's secrets need not be set.
			cfg, _, err := load(cmd, stderr, config.SecretsOptional())
			if err != nil {
				return err
			}
			lane = strings.ToLower(lane) // as the config loader lower-cases lane names
			lc, ok := cfg.Downstreams[lane]
			if !ok {
				names := make([]string, 0, len(cfg.Downstreams))
				for n := range cfg.Downstreams {
					names = append(names, n)
				}
				sort.Strings(names)
				return usage("--lane %q: no such lane (lanes: %s)", lane, strings.Join(names, ", "))
			}
			var arrivals []simulate.Arrival
			what := ""
			if trace != "" {
				f, err := os.Open(trace)
				if err != nil {
					return usage("%v", err)
				}
				arrivals, err = simulate.ReadTrace(f)
				f.Close()
				if err != nil {
					return usage("%s: %v", trace, err)
				}
				what = fmt.Sprintf("trace %s (%d arrivals)", trace, len(arrivals))
			} else {
				arrivals = simulate.Burst(burst, trickle, dur)
				var parts []string
				if burst > 0 {
					parts = append(parts, fmt.Sprintf("%d at once", burst))
				}
				if trickle > 0 {
					parts = append(parts, fmt.Sprintf("%g/s for %s", trickle, dur))
				}
				what = strings.Join(parts, ", then ")
				if len(arrivals) == 0 {
					return usage("--trickle %g/s for %s makes no arrival: the first comes one interval (1/RATE) in", trickle, dur)
				}
			}
			res := simulate.Run(lc, arrivals, simulate.Options{SinkLatency: latency})
			fmt.Fprintf(stdout, "shaper simulate: lane %s at %s, capacity %d, overflow %s", lane, lc.Rate.Limit, lc.Bucket.Capacity, lc.Bucket.Overflow)
			if lc.Bucket.FairKey != "" {
				fmt.Fprintf(stdout, ", fair_key %s", lc.Bucket.FairKey)
			}
			fmt.Fprintf(stdout, "; %s\n\n", what)
			res.WriteTable(stdout)
			res.WriteSummary(stdout)
			if svg != "" {
				f, err := os.Create(svg)
				if err != nil {
					return &exitError{code: exitFailure, err: fmt.Errorf("simulate: --svg: %w", err)}
				}
				title := fmt.Sprintf("shaper simulate: lane %s at %s, %s", lane, lc.Rate.Limit, what)
				err = errors.Join(res.WriteSVG(f, title), f.Close())
				if err != nil {
					return &exitError{code: exitFailure, err: fmt.Errorf("simulate: --svg %s: %w", svg, err)}
				}
				fmt.Fprintf(stdout, "wrote %s\n", svg)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringP("config", "c", "", "config file (default ./config.yaml)")
	f.StringVar(&lane, "lane", "", "the lane (downstreams.<lane>) whose rules to run (required)")
	f.StringVar(&trace, "trace", "", `arrival trace: CSV "time_offset_seconds[,key]" or JSON lines {"at": s, "key": k}`)
	f.IntVar(&burst, "burst", 0, "synthetic trace: N arrivals at once")
	f.Float64Var(&trickle, "trickle", 0, "RATE arrivals per second for --for D (after --burst N if given)")
	f.DurationVar(&dur, "for", 0, "with --trickle: for this long")
	f.DurationVar(&latency, "sink-latency", 0, "how long each sink call takes (holds a max_in_flight slot)")
	f.StringVar(&svg, "svg", "", "also draw arrivals, departures and depth to this SVG file")
	_ = cmd.MarkFlagRequired("lane")
	return cmd
}
