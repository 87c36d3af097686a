// Package deploy holds deployment files (Kubernetes, Prometheus rules, a
// Grafana dashboard, systemd, Dockerfile). This test keeps them honest: they
// parse, every metric they use exists in the daemon's registry, and the
// shutdown grace periods exceed the drain timeout plus the task timeout.
package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/metrics"
)

// knownMetrics returns the metric names the daemon exports, with the
// histogram series suffixes.
func knownMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	metrics.New(reg).Lane("x", 100)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, mf := range mfs {
		n := mf.GetName()
		known[n] = true
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			known[n+suf] = true
		}
	}
	return known
}

var metricRef = regexp.MustCompile(`\bshaper_[a-z_]+\b`)

func checkMetricRefs(t *testing.T, file, text string, known map[string]bool) int {
	t.Helper()
	refs := metricRef.FindAllString(text, -1)
	for _, r := range refs {
		if !known[r] {
			t.Errorf("%s uses metric %s, which the daemon does not export", file, r)
		}
	}
	return len(refs)
}

func TestAlertRules(t *testing.T) {
	raw, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	known := knownMetrics(t)
	rules := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			rules++
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("rule %+v lacks a name or an expression", r)
			}
			if checkMetricRefs(t, "alerts.yaml "+r.Alert, r.Expr, known) == 0 {
				t.Errorf("alert %s uses no shaper metric", r.Alert)
			}
		}
	}
	if rules < 5 {
		t.Errorf("%d alert rules, want at least the 5 of issue 6", rules)
	}
}

func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile("grafana/shaper.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("shaper.json: %v", err)
	}
	known := knownMetrics(t)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if checkMetricRefs(t, "dashboard panel "+p.Title, tg.Expr, known) == 0 {
				t.Errorf("panel %q target uses no shaper metric", p.Title)
			}
		}
	}
	if len(dash.Panels) < 6 {
		t.Errorf("%d panels", len(dash.Panels))
	}
}

// TestKubernetesManifests: every document parses; the sample config in the
// ConfigMap is a valid shaper config; the pod's grace period exceeds the
// drain timeout plus the longest task timeout.
func TestKubernetesManifests(t *testing.T) {
	files, _ := filepath.Glob("kubernetes/*.yaml")
	if len(files) < 4 {
		t.Fatalf("kubernetes manifests: %v", files)
	}
	var grace int
	var sample string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(raw)))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err != nil {
				if err.Error() == "EOF" {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			switch doc["kind"] {
			case "Deployment":
				spec := doc["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
				grace = spec["terminationGracePeriodSeconds"].(int)
			case "ConfigMap":
				if data, ok := doc["data"].(map[string]any); ok {
					sample, _ = data["config.yaml"].(string)
				}
			}
		}
	}
	if sample == "" {
		t.Fatal("no config.yaml in the ConfigMap")
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(sample), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range regexp.MustCompile(`\$\{([A-Z0-9_]+)\}`).FindAllStringSubmatch(sample, -1) {
		t.Setenv(v[1], "sample-value")
	}
	cfg, _, err := config.Load(path, nil)
	if err != nil {
		t.Fatalf("the ConfigMap's config does not load: %v", err)
	}
	need := cfg.Shutdown.DrainTimeout
	var longest time.Duration
	for _, l := range cfg.Downstreams {
		longest = max(longest, l.Task.Timeout)
	}
	need += longest
	if time.Duration(grace)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %d ≤ drain_timeout + task timeout = %v", grace, need)
	}
}

func TestSystemdUnit(t *testing.T) {
	raw, err := os.ReadFile("systemd/shaper.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)s?$`).FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatal("no TimeoutStopSec")
	}
	stop, _ := strconv.Atoi(m[1])
	// The repository's config.yaml: drain_timeout 30s, task timeout 5s.
	cfg, _, err := config.Load("../config.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	need := cfg.Shutdown.DrainTimeout + cfg.Downstreams["payments"].Task.Timeout
	if time.Duration(stop)*time.Second <= need {
		t.Errorf("TimeoutStopSec %ds ≤ %v", stop, need)
	}
	if !strings.Contains(string(raw), "KillSignal=SIGTERM") {
		t.Error("the unit must stop shaper with SIGTERM (graceful drain)")
	}
}

// TestAlertRulesPromtool runs `promtool check rules` and `promtool test
// rules` on prometheus/alerts.yaml and its unit tests
// (prometheus/alerts_test.yaml: the fallback alert keeps the instance
// label, ShaperConfigReloadFailed fires on a rejected reload). Without
// promtool the test is skipped, except in CI (CI=true), where that is a
// failure: scripts/test.sh installs it.
func TestAlertRulesPromtool(t *testing.T) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (scripts/test.sh installs it)")
		}
		t.Skip("promtool not found; run scripts/test.sh to install it")
	}
	runs := [][]string{{"prometheus", "check", "rules", "alerts.yaml"}, {"prometheus", "test", "rules", "alerts_test.yaml"}}
	more, _ := filepath.Glob("prometheus/tests/*.yaml") // rule_files relative to the test file
	for _, f := range more {
		runs = append(runs, []string{filepath.Dir(f), "test", "rules", filepath.Base(f)})
	}
	for _, run := range runs {
		cmd := exec.Command(bin, run[1:]...)
		cmd.Dir = run[0]
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s (in %s): %v\n%s", strings.Join(run[1:], " "), run[0], err, out)
		}
	}
}
