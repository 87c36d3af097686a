package deploy

import (
	"os"
	"strings"
	"testing"
)

// TestBreakerIsShown: SPEC §3 Breaker's gauge has its alert and its panel.
func TestBreakerIsShown(t *testing.T) {
	for _, f := range []string{"prometheus/alerts.yaml", "grafana/shaper.json"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(raw), "shaper_breaker_open") {
			t.Errorf("%s does not use shaper_breaker_open", f)
		}
	}
}
