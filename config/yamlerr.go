package config

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	"go.yaml.in/yaml/v3"
)

// yamlLine matches the position that both YAML parsers put in front of a
// syntax error.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlSyntaxError returns the syntax error of the YAML document raw with the
// line where the parser found the problem, or nil when raw parses.
//
// Why not viper's error (issue 12: an error on line 4 was reported as line
// 1): go.yaml.in/yaml/v3 names the line where the enclosing construct
// starts (its "context mark") rather than the problem's, and for parser
// errors it prints that 0-based line as it is. yaml/v2, the same libyaml
// port, names the problem's mark instead; it too is 0-based for parser errors
// ("did not find expected …"), 1-based for scanner errors. This function
// takes the problem's line from v2, made 1-based, and adds where the
// enclosing construct starts, from v3, when that is another line. Errors
// that are not syntax errors (a duplicate key: yaml.TypeError) already carry
// the right lines and are returned as v3 gives them.
func yamlSyntaxError(raw []byte) error {
	var n yaml.Node
	err3 := yaml.Unmarshal(raw, &n)
	if err3 == nil {
		return nil
	}
	var te *yaml.TypeError
	if errors.As(err3, &te) {
		return err3
	}
	var v any
	err2 := yamlv2.Unmarshal(raw, &v)
	if err2 == nil {
		return err3
	}
	line, msg, ok := yamlPos(err2)
	if !ok {
		return err3
	}
	lines := bytes.Count(raw, []byte("\n"))
	if len(raw) > 0 && raw[len(raw)-1] != '\n' {
		lines++
	}
	line = min(max(line, 1), max(lines, 1))
	out := fmt.Sprintf("yaml: line %d: %s", line, msg)
	if ctx, _, ok := yamlPos(err3); ok && ctx != line && ctx <= lines {
		out += fmt.Sprintf(" (in the value that starts on line %d)", ctx)
	}
	return errors.New(out)
}

// yamlPos returns the 1-based line and the message of a yaml syntax error.
func yamlPos(err error) (line int, msg string, ok bool) {
	m := yamlLine.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, "", false
	}
	line, _ = strconv.Atoi(m[1])
	if strings.HasPrefix(m[2], "did not find expected") {
		line++ // parser errors print the 0-based mark
	}
	return line, m[2], true
}
