package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/demo"
)

// demoDownstreamCmd is the child process of the demo: the rigid downstream.
func demoDownstreamCmd(stdout io.Writer) *cobra.Command {
	var limit float64
	cmd := &cobra.Command{
		Use:    demo.DownstreamCommand,
		Short:  "The demo's rigid downstream (started by shaper demo)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return demo.ServeDownstream(limit, os.Stdin, stdout)
		},
	}
	cmd.Flags().Float64Var(&limit, "limit", 100, "the lane's rate; requests closer than 1/(1.1 × limit) get 429")
	return cmd
}

func demoCmd(stdout, stderr io.Writer) *cobra.Command {
	o := demo.Options{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Shape a flash-sale burst into a rigid downstream, self-contained",
		Long: `demo starts an embedded NATS server, a built-in rigid HTTP downstream (it answers
429 to any request sooner than 1/(1.1 × limit) after the previous accepted one) and
one lane; publishes a flash-sale burst followed by a trickle; prints a per-second
table and a summary. It exits 1 if any message was lost or rejected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case !(o.Limit > 0) || o.Limit > 10000:
				return &exitError{code: exitUsage, err: fmt.Errorf("demo: --limit must be in (0, 10000], got %g", o.Limit)}
			case o.Burst < 0 || o.TrickleRate < 0 || o.TrickleFor < 0:
				return &exitError{code: exitUsage, err: errors.New("demo: --burst, --trickle-rate and --trickle-for must be ≥ 0")}
			case o.Burst+o.TrickleRate == 0:
				return &exitError{code: exitUsage, err: errors.New("demo: nothing to publish (--burst and --trickle-rate are 0)")}
			case o.BucketCapacity < 1 || o.MaxInFlight < 1 || o.Timeout <= 0:
				return &exitError{code: exitUsage, err: errors.New("demo: --capacity, --max-in-flight and --timeout must be positive")}
			}
			ok, err := demo.Run(cmd.Context(), o, stdout, stderr)
			if err != nil {
				return &exitError{code: exitFailure, err: fmt.Errorf("demo: %w", err)}
			}
			if !ok {
				return &exitError{code: exitFailure}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.Float64Var(&o.Limit, "limit", 100, "lane rate, messages per second")
	f.IntVar(&o.Burst, "burst", 1000, "messages published at once at the start (the flash sale)")
	f.IntVar(&o.TrickleRate, "trickle-rate", 20, "messages per second published after the burst")
	f.DurationVar(&o.TrickleFor, "trickle-for", 10*time.Second, "how long the trickle lasts")
	f.DurationVar(&o.Timeout, "timeout", 50*time.Second, "give up waiting for deliveries after this")
	f.IntVar(&o.MaxInFlight, "max-in-flight", 8, "task.max_in_flight of the lane")
	f.IntVar(&o.BucketCapacity, "capacity", 1000, "bucket.capacity of the lane")
	f.BoolVarP(&o.Verbose, "verbose", "v", false, "show the daemon's logs")
	return cmd
}
