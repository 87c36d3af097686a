package config

import (
	"os"
	"reflect"
	"regexp"
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

// TestRepositoryConfigListsEveryKey: issue 12 — config.yaml lists every key
// of the Config struct, set or commented where optional: each key's
// segments appear as "name:" in order, inside the top-level section the key
// belongs to (downstreams for lane keys).
func TestRepositoryConfigListsEveryKey(t *testing.T) {
	raw, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{} // top-level key (set or commented) → its text
	cur := ""
	topKey := regexp.MustCompile(`^#? ?([a-z_]+):`)
	for _, line := range strings.Split(string(raw), "\n") {
		if m := topKey.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, "# ") {
			cur = m[1]
		}
		sections[cur] += line + "\n"
	}
	has := func(text, name string) int {
		loc := regexp.MustCompile(`(^|[\s{,#])` + regexp.QuoteMeta(name) + `:`).FindStringIndex(text)
		if loc == nil {
			return -1
		}
		return loc[1]
	}
	check := func(section string, segments []string, key string) {
		text, ok := sections[section]
		if !ok {
			t.Errorf("config.yaml has no section %s: (for %s)", section, key)
			return
		}
		for _, seg := range segments {
			i := has(text, seg)
			if i < 0 {
				t.Errorf("config.yaml does not list %s (no %q in %s:)", key, seg+":", section)
				return
			}
			text = text[i:]
		}
	}
	n := 0
	for _, k := range leafKeys("", reflect.TypeFor[Config]()) {
		seg := strings.Split(k, ".")
		check(seg[0], seg[1:], k)
		n++
	}
	for _, k := range leafKeys("", reflect.TypeFor[Lane]()) {
		check("downstreams", strings.Split(k, "."), "downstreams.<lane>."+k)
		n++
	}
	if n < 40 {
		t.Fatalf("only %d keys: the walk is broken", n)
	}
}
