package main

import (
	"strings"
	"testing"
)

// TestOperatorUnknownSubcommand: "shaper dead-letters frob LANE" is a usage
// error (exit 2, README: "2 usage"), not the help and exit 0 that a script
// would take for success; "shaper dead-letters" alone prints the help.
func TestOperatorUnknownSubcommand(t *testing.T) {
	var out, errb strings.Builder
	if code := run([]string{"dead-letters", "frob", "payments"}, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), `"frob"`) {
		t.Errorf("dead-letters frob: exit %d, stderr %q; want 2 naming the command", code, errb.String())
	}
	out.Reset()
	if code := run([]string{"dead-letters"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "replay") {
		t.Errorf("dead-letters alone: exit %d, %q; want the help, exit 0", code, out.String())
	}
}
