package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

var (
	configType   = reflect.TypeOf(Config{})
	durationType = reflect.TypeOf(time.Duration(0))
	byteSizeType = reflect.TypeOf(ByteSize(0))
	rateType     = reflect.TypeOf(Rate(0))
)

// checkSchema walks a YAML node against the Go type it will be decoded
// into and records, with the key's dotted path, every unknown key,
// duplicate key and value of the wrong kind. yaml.v3's own errors name the
// Go type rather than the key path and stop at the first unknown field;
// this walk is what lets an operator fix a config in one pass.
//
// It also prunes what it reports, so that the rest of the document can
// still be decoded and validated in the same pass: an unknown or repeated
// key is removed, and a value of the wrong kind becomes null, which
// decodes as "absent" (the default stays). It reports whether n itself
// is usable; the caller nulls it otherwise.
//
// A null value (a key with nothing after the colon) is accepted anywhere
// and leaves the default in place, as yaml.v3 does.
func checkSchema(path string, n *yaml.Node, t reflect.Type, probs *Problems) bool {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return true
		}
		if !checkSchema(path, n.Content[0], t, probs) {
			n.Content[0] = null(n.Content[0])
		}
		return true
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return true
	}
	bad := func(format string, args ...any) bool {
		probs.add(path, fmt.Sprintf(format, args...)+fmt.Sprintf(" (line %d)", n.Line))
		return false
	}
	switch {
	case t == durationType:
		if n.Kind != yaml.ScalarNode {
			return bad("must be a duration such as 500ms, 30s or 5m, not %s", kindName(n))
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			return bad("%q is not a duration (use a unit: 500ms, 30s, 5m)", n.Value)
		}
	case t == byteSizeType:
		if n.Kind != yaml.ScalarNode {
			return bad("must be a size such as 1048576 or 64MiB, not %s", kindName(n))
		}
		if _, err := ParseByteSize(n.Value); err != nil {
			return bad("%v", err)
		}
	case t == rateType:
		if n.Kind != yaml.ScalarNode {
			return bad("must be a rate in bytes per second such as 512KiB or 10MB, not %s", kindName(n))
		}
		v, err := ParseByteSize(n.Value)
		if err != nil {
			return bad("%v", err)
		}
		if v <= 0 {
			return bad("%s must be > 0 bytes per second; leave the key out for no limit", v)
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return bad("must be a mapping of keys, not %s", kindName(n))
		}
		seen := map[string]bool{}
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			kp := join(path, k.Value)
			if seen[k.Value] {
				probs.add(kp, fmt.Sprintf("key given twice (line %d)", k.Line))
				continue
			}
			seen[k.Value] = true
			f, ok := fieldByTag(t, k.Value)
			if !ok {
				probs.add(kp, fmt.Sprintf("unknown key (line %d); known keys under %s: %s",
					k.Line, orTop(path), strings.Join(tags(t), ", ")))
				continue
			}
			if !checkSchema(kp, v, f.Type, probs) {
				v = null(v)
			}
			kept = append(kept, k, v)
		}
		n.Content = kept
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return bad("must be a list, not %s", kindName(n))
		}
		// A bad element becomes the zero value rather than going (yaml.v3
		// drops null elements), so the indices in later messages still
		// match the file.
		for i, e := range n.Content {
			if !checkSchema(fmt.Sprintf("%s[%d]", path, i), e, t.Elem(), probs) {
				n.Content[i] = zero(e, t.Elem())
			}
		}
	case t.Kind() == reflect.String:
		if n.Kind != yaml.ScalarNode {
			return bad("must be a single value, not %s", kindName(n))
		}
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		if n.Kind != yaml.ScalarNode {
			return bad("must be an integer, not %s", kindName(n))
		}
		if n.Tag != "!!int" {
			return bad("%q is not an integer", n.Value)
		}
		if _, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err != nil {
			return bad("%q is out of range", n.Value)
		}
	case t.Kind() == reflect.Bool:
		if n.Kind != yaml.ScalarNode {
			return bad("must be true or false, not %s", kindName(n))
		}
		if n.Tag != "!!bool" {
			return bad("%q is not true or false", n.Value)
		}
	default:
		// A field type added to Config without a case here is a programming
		// error; say so rather than accept anything.
		return bad("no schema rule for Go type %s", t)
	}
	return true
}

// kindName says what a node of the wrong kind is, for messages: a list's
// Value is empty, and `"" is not an integer` for `workers: [1]` misled.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	}
	return fmt.Sprintf("%q", n.Value)
}

// zero replaces a reported list element of type t: a node that decodes to
// t's zero value.
func zero(n *yaml.Node, t reflect.Type) *yaml.Node {
	z := &yaml.Node{Kind: yaml.ScalarNode, Line: n.Line, Column: n.Column}
	switch {
	case t == durationType:
		z.Tag, z.Value = "!!str", "0s"
	case t.Kind() == reflect.Struct:
		z.Kind, z.Tag = yaml.MappingNode, "!!map"
	case t.Kind() == reflect.Slice:
		z.Kind, z.Tag = yaml.SequenceNode, "!!seq"
	case t.Kind() == reflect.Bool:
		z.Tag, z.Value = "!!bool", "false"
	case t.Kind() == reflect.Int, t.Kind() == reflect.Int64:
		z.Tag, z.Value = "!!int", "0"
	default:
		z.Tag = "!!str"
	}
	return z
}

// null replaces a reported node: it decodes as an absent key.
func null(n *yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
}

func fieldByTag(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if yamlName(f) == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func tags(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		out = append(out, yamlName(t.Field(i)))
	}
	return out
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}
