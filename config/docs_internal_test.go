package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestDocsListEveryKey: docs/configuration.md documents every key of the
// Config struct, so the documentation and the code cannot drift (issue 6).
// Top-level keys appear as `nats.url`, lane keys as `source.ack_wait` (or
// with a `downstreams.<lane>.` prefix).
func TestDocsListEveryKey(t *testing.T) {
	raw, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	lane := map[string]bool{}
	for _, k := range leafKeys("", reflect.TypeFor[Lane]()) {
		lane[k] = true
		if !strings.Contains(doc, "`"+k+"`") && !strings.Contains(doc, "`downstreams.<lane>."+k+"`") {
			t.Errorf("docs/configuration.md does not document the lane key %s", k)
		}
	}
	for _, k := range leafKeys("", reflect.TypeFor[Config]()) {
		if strings.HasPrefix(k, "downstreams") {
			continue
		}
		if !strings.Contains(doc, "`"+k+"`") {
			t.Errorf("docs/configuration.md does not document %s", k)
		}
	}
	if len(lane) < 20 {
		t.Fatalf("only %d lane keys found: the walk is broken", len(lane))
	}
}
