package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/internal/testserver"
)

// The items an operator tripped over (issue 12), through the daemon.

// natsPassword is the password of the test servers' user: it must appear in
// no log line.
const natsPassword = "hunter2-s3cr3t"

// startAuthNATS starts an in-process NATS server on a free port whose only
// user is bob with natsPassword, with JetStream when js, and returns its
// host:port. A cleanup shuts it down.
func startAuthNATS(t *testing.T, js bool) string {
	t.Helper()
	opts := []testserver.NATSOption{testserver.WithUser("bob", natsPassword)}
	if !js {
		opts = append(opts, testserver.WithoutJetStream())
	}
	return testserver.NATS(t, opts...).Addr().String()
}

// authConfig is a config with one log lane and the given nats.url line.
func authConfig(natsURL string) string {
	return fmt.Sprintf(`
nats: { url: %q }
admin: { listen: "127.0.0.1:0" }
shutdown: { drain_timeout: 1s }
downstreams:
  creds:
    source: { stream: E2E_CREDS, subjects: ["e2e.creds.>"] }
    rate: { limit: 10/s }
    sink: { kind: log }
`, natsURL)
}

// TestE2ENATSURLPasswordNotLogged: issue 12 — the password of nats.url
// (a list of seeds) never appears in the logs, whether the URL comes from
// the file, SHAPER_NATS_URL or --nats.url; the logs show it redacted.
func TestE2ENATSURLPasswordNotLogged(t *testing.T) {
	addr := startAuthNATS(t, true)
	url := "nats://bob:" + natsPassword + "@" + addr + ",nats://bob:" + natsPassword + "@" + addr
	for _, from := range []string{"file", "env", "flag"} {
		t.Run(from, func(t *testing.T) {
			body := authConfig("")
			var flags *pflag.FlagSet
			switch from {
			case "file":
				body = authConfig(url)
			case "env":
				t.Setenv("SHAPER_NATS_URL", url)
			case "flag":
				flags = pflag.NewFlagSet("run", pflag.ContinueOnError)
				flags.String("nats.url", "", "")
				if err := flags.Parse([]string{"--nats.url=" + url}); err != nil {
					t.Fatal(err)
				}
			}
			cfg, _, err := config.Load(writeFile(t, "config.yaml", body), flags)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.NATS.URL != url {
				t.Fatalf("nats.url %q: the override did not apply, the test would prove nothing", config.RedactURL(cfg.NATS.URL))
			}
			d, err := startLoaded(t, cfg)
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			waitReady(t, d.AdminAddr(), 10*time.Second)
			d.stop(5 * time.Second)
			logs := d.logs.String()
			if !strings.Contains(logs, "shaper ready") || !strings.Contains(logs, "bob:***@") {
				t.Fatalf("no redacted URL in the logs: the test would prove nothing:\n%s", logs)
			}
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, natsPassword) {
					t.Errorf("the nats password appears in a log line: %s", strings.ReplaceAll(line, natsPassword, "<PASSWORD>"))
				}
			}
		})
	}
}

// TestE2ENoJetStream: issue 12 — a NATS server without JetStream fails the
// start with a message that says so, names the server (credentials
// redacted) and the fix, instead of "nats: no responders available for
// request".
func TestE2ENoJetStream(t *testing.T) {
	addr := startAuthNATS(t, false)
	cfg, _, err := config.Load(writeFile(t, "config.yaml",
		authConfig("nats://bob:"+natsPassword+"@"+addr)), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.NATS.Embedded.StoreDir = filepath.Join(t.TempDir(), "unused")
	_, err = startLoaded(t, cfg)
	if err == nil {
		t.Fatal("the daemon started on a server without JetStream")
	}
	msg := err.Error()
	for _, want := range []string{"JetStream is not enabled on the NATS server at nats://bob:***@" + addr, "-js"} {
		if !strings.Contains(msg, want) {
			t.Errorf("start error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, natsPassword) || strings.Contains(msg, "no responders") {
		t.Errorf("start error %q shows the password or the raw no-responders error", msg)
	}
}

// TestE2EReloadOutcomeMetrics: issue 12 — a rejected reload shows in
// /metrics, not only in the logs: shaper_config_last_reload_successful is 1
// from the start, 0 after a reload of a file that does not validate (the
// success timestamp stays), and 1 again, with a later timestamp, after a
// valid one.
func TestE2EReloadOutcomeMetrics(t *testing.T) {
	good := fmt.Sprintf(`
nats: { url: "", embedded: { listen: "127.0.0.1:0", store_dir: %q } }
admin: { listen: "127.0.0.1:0" }
shutdown: { drain_timeout: 1s }
downstreams:
  reload:
    source: { stream: E2E_RELOAD, subjects: ["e2e.reload.>"] }
    rate: { limit: 10/s }
    sink: { kind: log }
`, filepath.Join(t.TempDir(), "nats"))
	path := writeFile(t, "config.yaml", good)
	cfg, _, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := startLoaded(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	load := func() (*config.Config, error) {
		c, _, err := config.Load(path, nil)
		return c, err
	}
	read := func() (ok, at float64) {
		s := scrape(t, d.AdminAddr())
		return metricValue(t, s, "shaper_config_last_reload_successful", map[string]string{}),
			metricValue(t, s, "shaper_config_last_reload_success_timestamp_seconds", map[string]string{})
	}
	ok0, at0 := read()
	if ok0 != 1 || at0 < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Fatalf("at start: successful %v, timestamp %v; want 1 and the start time", ok0, at0)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(good, "limit: 10/s", "limit: 0/s", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.ApplyReload("test", load); err == nil {
		t.Fatal("a file with limit 0/s was accepted")
	}
	if ok, at := read(); ok != 0 || at != at0 {
		t.Errorf("after a rejected reload: successful %v, timestamp %v; want 0 and %v kept", ok, at, at0)
	}
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(path, []byte(strings.Replace(good, "limit: 10/s", "limit: 20/s", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.ApplyReload("test", load); err != nil {
		t.Fatal(err)
	}
	if ok, at := read(); ok != 1 || at <= at0 {
		t.Errorf("after a valid reload: successful %v, timestamp %v; want 1 and later than %v", ok, at, at0)
	}
}

// TestE2EStreamRetentionDefaults: issue 12 — the streams the daemon creates
// no longer keep every message forever: the source stream gets
// source.retention's default (limits, max_age 7 days), the dead-letter
// stream dead_letter_stream's (max_age 30 days).
func TestE2EStreamRetentionDefaults(t *testing.T) {
	d := startDaemon(t, strings.Replace(authConfig(""), `nats: { url: "" }`,
		fmt.Sprintf(`nats: { url: "", embedded: { listen: "127.0.0.1:0", store_dir: %q } }`, filepath.Join(t.TempDir(), "nats")), 1))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for name, want := range map[string]time.Duration{"E2E_CREDS": 7 * 24 * time.Hour, "SHAPER_DEAD": 30 * 24 * time.Hour} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		if c.Retention != jetstream.LimitsPolicy || c.MaxAge != want {
			t.Errorf("stream %s: retention %v, max_age %v; want limits, %v", name, c.Retention, c.MaxAge, want)
		}
	}
}
