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
)

// checkSchema walks a YAML node against the Go type it will be decoded
// into and records, with the key's dotted path, every unknown key,
// duplicate key and value of the wrong kind. yaml.v3's own errors name the
// Go type rather than the key path and stop at the first unknown field;
// this walk is what lets an operator fix a config in one pass.
//
// A null value (a key with nothing after the colon) is accepted anywhere
// and leaves the default in place, as yaml.v3 does.
func checkSchema(path string, n *yaml.Node, t reflect.Type, probs *Problems) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return
		}
		checkSchema(path, n.Content[0], t, probs)
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	bad := func(format string, args ...any) {
		probs.add(path, fmt.Sprintf(format, args...)+fmt.Sprintf(" (line %d)", n.Line))
	}
	switch {
	case t == durationType:
		if n.Kind != yaml.ScalarNode {
			bad("must be a duration such as 500ms, 30s or 5m")
			return
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			bad("%q is not a duration (use a unit: 500ms, 30s, 5m)", n.Value)
		}
	case t == byteSizeType:
		if n.Kind != yaml.ScalarNode {
			bad("must be a size such as 1048576 or 64MiB")
			return
		}
		if _, err := ParseByteSize(n.Value); err != nil {
			bad("%v", err)
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			bad("must be a mapping of keys")
			return
		}
		seen := map[string]bool{}
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
			checkSchema(kp, v, f.Type, probs)
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			bad("must be a list")
			return
		}
		for i, e := range n.Content {
			checkSchema(fmt.Sprintf("%s[%d]", path, i), e, t.Elem(), probs)
		}
	case t.Kind() == reflect.String:
		if n.Kind != yaml.ScalarNode {
			bad("must be a single value")
		}
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			bad("%q is not an integer", n.Value)
			return
		}
		if _, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err != nil {
			bad("%q is out of range", n.Value)
		}
	case t.Kind() == reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			bad("%q is not true or false", n.Value)
		}
	default:
		// A field type added to Config without a case here is a programming
		// error; say so rather than accept anything.
		bad("no schema rule for Go type %s", t)
	}
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
