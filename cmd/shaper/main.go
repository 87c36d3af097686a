// Command shaper is the daemon: it pulls jobs from NATS JetStream into a
// bounded bucket per downstream and releases them at a constant rate. This
// package only wires the other packages together and handles signals.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/daemon"
	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
)

// Exit codes (STYLE.md): 0 clean stop, 1 runtime failure, 2 bad usage or
// invalid config.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// version is set with -ldflags "-X main.version=..." by release builds.
var version = ""

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func run(args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "shaper",
		Short:         "Release JetStream jobs to rigid downstreams at a constant rate",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	root.AddCommand(runCmd(stdout, stderr), validateCmd(stdout, stderr), demoCmd(stdout, stderr), demoDownstreamCmd(stdout), versionCmd(stdout))
	root.AddCommand(simulateCmd(stdout, stderr))
	root.AddCommand(operatorCmds(stdout, stderr)...)
	if err := root.Execute(); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.err != nil {
				fmt.Fprintln(stderr, ee.err)
			}
			return ee.code
		}
		fmt.Fprintln(stderr, "shaper:", err)
		return exitUsage
	}
	return exitOK
}

// load reads and validates the config, printing warnings; an invalid config
// is an exitError with code 2 listing every problem.
func load(cmd *cobra.Command, stderr io.Writer, opts ...config.LoadOption) (*config.Config, []config.Warning, error) {
	path, _ := cmd.Flags().GetString("config")
	cfg, warns, err := config.Load(path, cmd.Flags(), opts...)
	if err != nil {
		// The problems first, under their header, then the warnings: the
		// problems are what stops the command (a new-user pass read the
		// warnings printed above the header as the reason).
		var b strings.Builder
		for _, w := range warns {
			b.WriteString("\n" + w.String())
		}
		if b.Len() > 0 {
			return nil, warns, &exitError{code: exitUsage, err: fmt.Errorf("invalid configuration:\n%w\nwarnings:%s", err, b.String())}
		}
		return nil, warns, &exitError{code: exitUsage, err: fmt.Errorf("invalid configuration:\n%w", err)}
	}
	if cmd.Name() != "run" { // run logs them with its own logger
		for _, w := range warns {
			if !aboutOtherLane(cmd, w.Key) {
				fmt.Fprintln(stderr, w.String())
			}
		}
	}
	return cfg, warns, nil
}

// aboutOtherLane reports whether a warning at key concerns a lane other than
// the one a command runs (simulate --lane): a new-user pass read another
// lane's ack_wait warning above a simulation that did not use it. Keys
// outside downstreams (nats.creds, ...) concern every lane.
func aboutOtherLane(cmd *cobra.Command, key string) bool {
	f := cmd.Flags().Lookup("lane")
	if f == nil || f.Value.String() == "" {
		return false
	}
	rest, ok := strings.CutPrefix(key, "downstreams.")
	if !ok {
		return false
	}
	name, _, _ := strings.Cut(rest, ".")
	return name != strings.ToLower(f.Value.String())
}

// addConfigFlags adds -c/--config and the flags that override keys of the
// file and the environment (SPEC §4: file, then SHAPER_* environment, then
// flags). A flag's name is its key path.
func addConfigFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringP("config", "c", "", "config file (default ./config.yaml)")
	f.String("nats.url", "", `NATS server URL ("" = embedded server)`)
	f.String("nats.embedded.listen", "", "embedded NATS server address (port 0 = any free port)")
	f.String("nats.embedded.store_dir", "", "embedded NATS JetStream storage directory")
	f.String("admin.listen", "", "address of /metrics, /healthz, /readyz")
	f.String("log.level", "", "debug|info|warn|error")
	f.String("log.format", "", "text|json")
	f.String("shutdown.drain_timeout", "", "how long the drain keeps departing after SIGTERM (e.g. 30s)")
}

func validateCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check the configuration; exit 0 when valid, 2 when not",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, warns, err := load(cmd, stderr)
			if err != nil {
				return err
			}
			plural := "s"
			if len(warns) == 1 {
				plural = ""
			}
			fmt.Fprintf(stdout, "configuration valid (%d warning%s)\n", len(warns), plural)
			return nil
		},
	}
	addConfigFlags(cmd)
	return cmd
}

func newLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if strings.EqualFold(format, "json") {
		// Durations as the text log and the config write them ("500ms"),
		// not as nanoseconds ("retry_in":500000000, a new-user pass).
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func runCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, warns, err := load(cmd, stderr)
			if err != nil {
				return err
			}
			log := newLogger(stderr, cfg.Log.Level, cfg.Log.Format)
			for _, w := range warns {
				log.Warn("config warning", "problem", w.String())
			}
			defer drain.StartGCFloor(log).Stop() // drain/memory.go: the GC floor
			d := daemon.New(cfg, log, stdout)
			path, _ := cmd.Flags().GetString("config")
			if path == "" {
				path = config.DefaultPath
			}
			reload := func() (*config.Config, error) {
				cfg, warns, err := config.Load(path, cmd.Flags())
				for _, w := range warns {
					log.Warn("config warning", "problem", w.String())
				}
				return cfg, err
			}
			if err := daemon.Serve(d, log, path, reload); err != nil {
				return &exitError{code: exitFailure, err: err}
			}
			return nil
		},
	}
	addConfigFlags(cmd)
	return cmd
}

func versionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			v := version
			if v == "" {
				if bi, ok := debug.ReadBuildInfo(); ok {
					v = bi.Main.Version
				}
			}
			if v == "" {
				v = "(devel)"
			}
			fmt.Fprintln(stdout, "shaper", v)
		},
	}
}
