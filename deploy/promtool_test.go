package deploy

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// TestAlertRulesPromtool checks alerts.yaml with promtool and runs the rule
// unit tests in prometheus/tests/ (promtool test rules): each alert fires
// when it should, with its labels and annotations, and not before its "for".
// Skipped when promtool is not on PATH.
func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not on PATH")
	}
	if out, err := exec.Command(promtool, "check", "rules", "prometheus/alerts.yaml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	tests, _ := filepath.Glob("prometheus/tests/*.yaml")
	if len(tests) == 0 {
		t.Fatal("no rule tests in prometheus/tests/")
	}
	for _, f := range tests {
		cmd := exec.Command(promtool, "test", "rules", filepath.Base(f))
		cmd.Dir = filepath.Dir(f) // rule_files are relative to the test file
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool test rules %s: %v\n%s", f, err, out)
		}
	}
}
