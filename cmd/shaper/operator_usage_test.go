package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/admin"
	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/sources"
)

// TestOperatorUnknownSubcommand: "shaper dead-letters frob LANE" is a usage
// error (exit 2, README: "2 usage"), not the help and exit 0 that a script
// would take for success, also when a subcommand's flag follows
// ("dead-letters payments -c config.yaml"); "shaper dead-letters" alone
// prints the help.
func TestOperatorUnknownSubcommand(t *testing.T) {
	var out, errb strings.Builder
	if code := run([]string{"dead-letters", "frob", "payments"}, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), `"frob"`) {
		t.Errorf("dead-letters frob: exit %d, stderr %q; want 2 naming the command", code, errb.String())
	}
	// A subcommand's flag after a wrong word names the word, not the flag.
	errb.Reset()
	if code := run([]string{"dead-letters", "payments", "-c", "config.yaml"}, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), `"payments" (list or replay)`) {
		t.Errorf("dead-letters payments -c: exit %d, stderr %q; want 2 naming the word", code, errb.String())
	}
	out.Reset()
	if code := run([]string{"dead-letters"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "replay") {
		t.Errorf("dead-letters alone: exit %d, %q; want the help, exit 0", code, out.String())
	}
}

// TestOperatorDefaultAdminHint: with no config here and no --admin, the
// operator commands try the default admin.listen; when nothing answers
// there, the error says the address was a default and how to name the
// daemon (a new user ran "shaper lanes" in another directory and saw only
// "connection refused" on 127.0.0.1:9464).
func TestOperatorDefaultAdminHint(t *testing.T) {
	t.Chdir(t.TempDir())
	t.Setenv("SHAPER_ADMIN_LISTEN", "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	var out, errb strings.Builder
	// --admin named: no hint.
	if code := run([]string{"lanes", "--admin", addr}, &out, &errb); code != exitFailure || strings.Contains(errb.String(), "default admin.listen") {
		t.Errorf("lanes --admin: exit %d, stderr %q; want 1 without the hint", code, errb.String())
	}
	if c, err := net.Dial("tcp", config.DefaultAdminListen); err == nil {
		c.Close()
		t.Logf("something listens on %s (a daemon of this machine): the default's hint is not checked", config.DefaultAdminListen)
		return
	}
	errb.Reset()
	code := run([]string{"lanes"}, &out, &errb)
	if code != exitFailure || !strings.Contains(errb.String(), "the default admin.listen: there is no ./config.yaml here") ||
		!strings.Contains(errb.String(), "--admin") {
		t.Errorf("lanes with no config: exit %d, stderr %q; want 1 with the hint", code, errb.String())
	}
}

// TestPrintLanesRates: shaper lanes shows the rate in force and the limit
// as a person reads them, mid-warmup too (found by a new-user pass:
// 3.3519162934999995/5/s).
func TestPrintLanesRates(t *testing.T) {
	var b strings.Builder
	printLanes(&b, []admin.LaneView{{Lane: "ok", State: "running", Rate: 3.3519162934999995, Limit: 5, Capacity: 10},
		{Lane: "big", State: "running", Rate: 2e6, Limit: 2e6, Capacity: 10}})
	for _, want := range []string{"3.352/5/s", "2000000/2000000/s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("shaper lanes lacks %q:\n%s", want, b.String())
		}
	}
}

// TestDeadLetterTableStatus: the table of `dead-letters list` shows "-" for a
// dead letter with no status on record (Shaper-Last-Status absent, README),
// not 0, and the status where there is one.
func TestDeadLetterTableStatus(t *testing.T) {
	var b strings.Builder
	at := time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC)
	if err := writeDeadLetters(&b, []sources.DeadLetter{
		{Seq: 1, Time: at, Reason: "invalid", Attempts: 1, Key: "k-1", LastError: "bad Shaper-Deadline"},
		{Seq: 2, Time: at, Reason: "rejected_by_sink", Attempts: 1, LastStatus: 410, Key: "k-2", LastError: "410 Gone"},
	}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("table:\n%s", b.String())
	}
	col := func(line string) string { return strings.Fields(line)[4] }
	if col(lines[1]) != "-" || col(lines[2]) != "410" {
		t.Errorf("STATUS column %q and %q, want - and 410:\n%s", col(lines[1]), col(lines[2]), b.String())
	}
}
