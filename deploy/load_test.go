package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// repoRoot is where template.yaml, sam.mk, env.json and events/ live.
const repoRoot = ".."

// Intrinsics are rendered in one notation so tests compare plain strings:
// !Ref X -> "${X}", !GetAtt A.B -> "${A.B}", !Sub s -> s (its own ${...}
// left in place). Other short forms (!If, !Not, ...) become {"Fn::If": ...}.
func renderRef(name string) string { return "${" + name + "}" }

// loadRaw parses template.yaml as plain YAML, with the short intrinsic
// tags rendered as above. Validation against the resource schemas is
// cfn-lint's job (cfnlint_test.go); these tests check the project's own
// rules on the parsed tree.
func loadRaw(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("yaml: parse template.yaml: %v", err)
	}
	v, err := convert(doc.Content[0])
	if err != nil {
		t.Fatalf("convert template.yaml: %v", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("template.yaml is not a mapping")
	}
	return m
}

func convert(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.AliasNode:
		return convert(n.Alias)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := convert(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return tagged(n, m)
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := convert(c)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return tagged(n, s)
	case yaml.ScalarNode:
		if strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!") {
			return tagged(n, n.Value)
		}
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		return v, nil
	}
	return nil, fmt.Errorf("line %d: unexpected yaml node kind %d", n.Line, n.Kind)
}

// tagged applies a CloudFormation short-form tag (!Ref, !GetAtt, !Sub, ...)
// to an already converted value.
func tagged(n *yaml.Node, v any) (any, error) {
	if !strings.HasPrefix(n.Tag, "!") || strings.HasPrefix(n.Tag, "!!") {
		return v, nil
	}
	switch n.Tag {
	case "!Ref", "!GetAtt":
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("line %d: %s needs a scalar", n.Line, n.Tag)
		}
		return renderRef(s), nil
	case "!Sub":
		if s, ok := v.(string); ok {
			return s, nil
		}
		return nil, fmt.Errorf("line %d: only the string form of !Sub is used here", n.Line)
	default:
		return map[string]any{"Fn::" + n.Tag[1:]: v}, nil
	}
}

// at walks a converted YAML tree by keys and indexes, failing the test with
// the path when something is missing.
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	cur := v
	for i, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := cur.(map[string]any)
			if !ok {
				t.Fatalf("%v: not a mapping", path[:i+1])
			}
			if cur, ok = m[k]; !ok {
				t.Fatalf("%v: missing", path[:i+1])
			}
		case int:
			s, ok := cur.([]any)
			if !ok || k >= len(s) {
				t.Fatalf("%v: not a list with index %d", path[:i+1], k)
			}
			cur = s[k]
		}
	}
	return cur
}

// strs reads a string or a list of strings (IAM's Action/Resource forms).
func strs(t *testing.T, v any) []string {
	t.Helper()
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				t.Fatalf("expected a string, got %T %v", e, e)
			}
			out = append(out, s)
		}
		return out
	}
	t.Fatalf("expected a string or list of strings, got %T %v", v, v)
	return nil
}

// resources returns the template's resources of one type, by logical id.
func resources(t *testing.T, raw map[string]any, typ string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for id, r := range at(t, raw, "Resources").(map[string]any) {
		res, ok := r.(map[string]any)
		if !ok {
			t.Fatalf("Resources.%s is not a mapping", id)
		}
		if res["Type"] == typ {
			out[id] = res
		}
	}
	return out
}

// props returns a resource's Properties (empty when it has none).
func props(res map[string]any) map[string]any {
	p, _ := res["Properties"].(map[string]any)
	if p == nil {
		return map[string]any{}
	}
	return p
}

// sortedKeys lists a map's keys in order, for stable messages.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readDoc reads a file of the repository (docs, README) as text.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
