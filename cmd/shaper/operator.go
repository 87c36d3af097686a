package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/admin"
	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources"
)

// The operator commands of SPEC §5: clients of a running daemon's admin API
// (docs/admin-api.md). Exit codes: 0 done, 1 refused or failed, 2 usage.

// adminTokenEnv is where the operator commands read admin.token.
const adminTokenEnv = "SHAPER_ADMIN_TOKEN"

// operatorClient talks to the admin API.
type operatorClient struct {
	base   string // http://host:port
	token  string
	output string // table|json
	stdout io.Writer
	// guessed, when not empty, says that base is the default admin.listen
	// because no config named the daemon: the hint of a failed connection.
	guessed string
}

// addOperatorFlags adds --admin, -c and -o.
func addOperatorFlags(cmd *cobra.Command) {
	cmd.Flags().String("admin", "", "the daemon's admin URL (default: http:// + admin.listen of --config)")
	cmd.Flags().StringP("config", "c", "", "config file whose admin.listen to use (default ./config.yaml)")
	cmd.Flags().StringP("output", "o", "table", "output: table or json")
}

func newOperatorClient(cmd *cobra.Command, stdout, stderr io.Writer) (*operatorClient, error) {
	out, _ := cmd.Flags().GetString("output")
	if out != "table" && out != "json" {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("-o: want table or json, got %q", out)}
	}
	base, _ := cmd.Flags().GetString("admin")
	guessed := ""
	if base == "" {
		path, _ := cmd.Flags().GetString("config")
		explicit := path != ""
		if !explicit {
			path = config.DefaultPath
		}
		listen, err := config.AdminListen(path, explicit)
		if err != nil {
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("shaper: -c %s: %w (or name the daemon with --admin URL)", path, err)}
		}
		if _, serr := os.Stat(path); serr != nil && !explicit && os.Getenv("SHAPER_ADMIN_LISTEN") == "" {
			guessed = fmt.Sprintf(" (the default admin.listen: there is no %s here; name the daemon's config with -c FILE or its admin URL with --admin)", path)
		}
		host, port, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("shaper: admin.listen %q of %s: %w", listen, path, err)}
		}
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		base = "http://" + net.JoinHostPort(host, port)
	} else if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	if u, err := url.Parse(base); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("--admin: want a URL such as http://127.0.0.1:9464, got %q", base)}
	}
	return &operatorClient{base: strings.TrimRight(base, "/"), token: os.Getenv(adminTokenEnv), output: out, stdout: stdout, guessed: guessed}, nil
}

// call sends a request and decodes a 200 answer into out; an error answer
// becomes an exitError with code 1 and the API's message.
func (c *operatorClient) call(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	hc := &http.Client{Timeout: time.Minute}
	resp, err := hc.Do(req)
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("shaper: admin API at %s%s: %w", c.base, c.guessed, err)}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(raw))
		}
		code := exitFailure // refused or failed
		if resp.StatusCode == http.StatusBadRequest {
			code = exitUsage // the request's values
		}
		return &exitError{code: code, err: fmt.Errorf("shaper: %s %s: %s: %s", method, path, resp.Status, e.Error)}
	}
	if c.output == "json" {
		_, _ = c.stdout.Write(raw)
		return nil
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return &exitError{code: exitFailure, err: fmt.Errorf("shaper: %s %s: %w", method, path, err)}
		}
	}
	return nil
}

// operatorCmds returns the operator commands of SPEC §5.
func operatorCmds(stdout, stderr io.Writer) []*cobra.Command {
	cmds := []*cobra.Command{lanesCmd(stdout, stderr), pauseCmd(stdout, stderr), resumeCmd(stdout, stderr), purgeCmd(stdout, stderr)}
	for _, c := range cmds {
		addOperatorFlags(c)
	}
	return append(cmds, deadLettersCmd(stdout, stderr))
}

func lanesCmd(stdout, stderr io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "lanes",
		Short: "List the running daemon's lanes: state, rate, depth, in flight, dead letters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newOperatorClient(cmd, stdout, stderr)
			if err != nil {
				return err
			}
			var views []admin.LaneView
			if err := c.call(http.MethodGet, "/v1/lanes", nil, &views); err != nil || c.output == "json" {
				return err
			}
			printLanes(stdout, views)
			if why := c.notReady(); why != "" {
				// The lanes' states do not show it (a lane whose source is
				// disconnected holds its departures but is not paused):
				// found by a new-user pass.
				fmt.Fprintf(stdout, "daemon %s\n", why)
			}
			return nil
		},
	}
}

// notReady is the daemon's answer at /readyz when it is not ready ("not
// ready: nats not connected"), or "" when it is ready or does not answer.
func (c *operatorClient) notReady() string {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(c.base + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	return strings.TrimSpace(string(raw))
}

func pauseCmd(stdout, stderr io.Writer) *cobra.Command {
	pause := &cobra.Command{
		Use:   "pause LANE",
		Short: "Pause a lane on every replica (optionally for a duration)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newOperatorClient(cmd, stdout, stderr)
			if err != nil {
				return err
			}
			// --for 0s would be taken as no --for (until resumed): refused,
			// so that a pause asked to be short is never one without end.
			d, _ := cmd.Flags().GetDuration("for")
			if d <= 0 && cmd.Flags().Changed("for") {
				return &exitError{code: exitUsage, err: errors.New("--for: want a positive duration (leave --for out to pause until resumed)")}
			}
			reason, _ := cmd.Flags().GetString("reason")
			req := admin.PauseRequest{Reason: reason}
			if d > 0 {
				req.For = d.String()
			}
			var v admin.LaneView
			if err := c.call(http.MethodPost, "/v1/lanes/"+url.PathEscape(args[0])+"/pause", req, &v); err != nil || c.output == "json" {
				return err
			}
			printLanes(stdout, []admin.LaneView{v})
			return nil
		},
	}
	pause.Flags().Duration("for", 0, "how long (e.g. 10m); default until resumed")
	pause.Flags().String("reason", "", "why, shown by shaper lanes and the console")
	return pause
}

func resumeCmd(stdout, stderr io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "resume LANE",
		Short: "End an operator's pause (or an open breaker) of a lane",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newOperatorClient(cmd, stdout, stderr)
			if err != nil {
				return err
			}
			var v admin.LaneView
			if err := c.call(http.MethodPost, "/v1/lanes/"+url.PathEscape(args[0])+"/resume", struct{}{}, &v); err != nil || c.output == "json" {
				return err
			}
			printLanes(stdout, []admin.LaneView{v})
			return nil
		},
	}
}

func purgeCmd(stdout, stderr io.Writer) *cobra.Command {
	purge := &cobra.Command{
		Use:   "purge LANE --yes",
		Short: "Move what a lane holds and has pending to its dead letters (reason purged)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if yes, _ := cmd.Flags().GetBool("yes"); !yes {
				return &exitError{code: exitUsage, err: errors.New("purge drops the lane's work into dead letters: confirm with --yes")}
			}
			c, err := newOperatorClient(cmd, stdout, stderr)
			if err != nil {
				return err
			}
			var r admin.PurgeResult
			if err := c.call(http.MethodPost, "/v1/lanes/"+url.PathEscape(args[0])+"/purge", struct{}{}, &r); err != nil || c.output == "json" {
				return err
			}
			fmt.Fprintf(stdout, "purging %s up to stream sequence %d: %d taken from the bucket, %d pending go to dead letters as they arrive\n",
				args[0], r.UpToSeq, r.Held, r.Pending)
			return nil
		},
	}
	purge.Flags().Bool("yes", false, "confirm")
	return purge
}

func deadLettersCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{Use: "dead-letters", Short: "List or replay a lane's dead letters",
		// Without this cobra prints the help for an unknown subcommand and
		// exits 0: a script would take "dead-letters frob" for success.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("shaper dead-letters: unknown command %q (list or replay)", args[0])}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		// "dead-letters foo -c x": the subcommands' flags are unknown here,
		// and cobra's "unknown shorthand flag: 'c'" hid the real mistake
		// (no list or replay); Args names it.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
	}
	filterFlags := func(cmd *cobra.Command, limitName string) {
		cmd.Flags().String("reason", "", "only this reason (e.g. max_deliver)")
		cmd.Flags().String("since", "", "only dead-lettered since (RFC 3339, or a duration back such as 1h)")
		cmd.Flags().Int(limitName, 0, "at most this many (0 = all)")
		addOperatorFlags(cmd)
	}
	list := &cobra.Command{
		Use:   "list LANE",
		Short: "List a lane's dead letters, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newOperatorClient(cmd, stdout, stderr)
			if err != nil {
				return err
			}
			q := url.Values{}
			for _, k := range []string{"reason", "since"} {
				if v, _ := cmd.Flags().GetString(k); v != "" {
					q.Set(k, v)
				}
			}
			if n, _ := cmd.Flags().GetInt("limit"); n > 0 {
				q.Set("limit", fmt.Sprint(n))
			} else if n < 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--limit: want ≥ 0, got %d", n)}
			}
			var dls []sources.DeadLetter
			if err := c.call(http.MethodGet, "/v1/lanes/"+url.PathEscape(args[0])+"/dead-letters?"+q.Encode(), nil, &dls); err != nil || c.output == "json" {
				return err
			}
			return writeDeadLetters(stdout, dls)
		},
	}
	filterFlags(list, "limit")
	replay := &cobra.Command{
		Use:   "replay LANE",
		Short: "Replay a lane's dead letters through the lane at its rate, with their original keys",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newOperatorClient(cmd, stdout, stderr)
			if err != nil {
				return err
			}
			reason, _ := cmd.Flags().GetString("reason")
			since, _ := cmd.Flags().GetString("since")
			maxN, _ := cmd.Flags().GetInt("max")
			if maxN < 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--max: want ≥ 0, got %d", maxN)}
			}
			var r map[string]int
			if err := c.call(http.MethodPost, "/v1/lanes/"+url.PathEscape(args[0])+"/dead-letters/replay",
				admin.ReplayRequest{Reason: reason, Since: since, Max: maxN}, &r); err != nil || c.output == "json" {
				return err
			}
			fmt.Fprintf(stdout, "replayed %d dead letters of %s: they go through the lane at its rate\n", r["replayed"], args[0])
			return nil
		},
	}
	filterFlags(replay, "max")
	root.AddCommand(list, replay)
	return root
}

// printLanes prints one line per lane.
func printLanes(w io.Writer, views []admin.LaneView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tSTATE\tRATE\tACHIEVED\tDEPTH\tIN FLIGHT\tDEAD LETTERS\tNOTE")
	for _, v := range views {
		note := v.PauseReason
		if v.PausedUntil != nil {
			note += " until " + v.PausedUntil.Format(time.RFC3339)
		}
		if note == "" && v.LastError != "" {
			note = "last error: " + v.LastError
		}
		fmt.Fprintf(tw, "%s\t%s\t%s/%s/s\t%.1f/s\t%d/%d\t%d\t%d\t%s\n", v.Lane, v.State, shaper.FormatRate(v.Rate), shaper.FormatRate(v.Limit), v.Achieved,
			v.Depth, v.Capacity, v.InFlight, v.DeadLetters, strings.TrimSpace(note))
	}
	_ = tw.Flush()
}

// writeDeadLetters prints dead letters as the table of `dead-letters list`.
// STATUS is "-" for a dead letter with no answer on record (Shaper-Last-Status
// absent: dead-lettered before this delivery reached the sink, or no HTTP
// answer), not 0, which read as "the downstream answered 0" (a new-user pass).
func writeDeadLetters(w io.Writer, dls []sources.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tREASON\tATTEMPTS\tSTATUS\tKEY\tLAST ERROR")
	for _, d := range dls {
		status := "-"
		if d.LastStatus != 0 {
			status = strconv.Itoa(d.LastStatus)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", d.Seq, d.Time.Format(time.RFC3339), d.Reason, d.Attempts, status, d.Key, d.LastError)
	}
	return tw.Flush()
}
