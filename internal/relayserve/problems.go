package relayserve

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A configuration is checked whole and every problem reported at once,
// each on its own line and, where the file has the key, with its line
// number: an operator fixing a file should not need one run per mistake,
// nor have to guess where a rule's key sits in a long file.

// keyError is a rule the value at key breaks. key is the path of YAML
// keys (["limits", "max_body_bytes"]); its line is looked up in the
// document (or its nearest ancestor's, when the key is absent: a custom
// budget missing a field points at budget).
type keyError struct {
	key []string
	msg string
}

func (e *keyError) Error() string { return e.msg }

func keyErr(key []string, format string, args ...any) error {
	return &keyError{key: key, msg: fmt.Sprintf(format, args...)}
}

// Problems is what Load and Parse return for a configuration that breaks
// rules: every problem, each a line of the message. It wraps ErrConfig
// and each problem.
type Problems []error

func (p Problems) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: %d problem", ErrConfig, len(p))
	if len(p) != 1 {
		b.WriteString("s")
	}
	for _, e := range p {
		b.WriteString("\n  ")
		b.WriteString(strings.ReplaceAll(e.Error(), "\n", "\n  "))
	}
	return b.String()
}

func (p Problems) Unwrap() []error { return append([]error{ErrConfig}, p...) }

// lines maps the document's keys to their line numbers, and its scalar
// values to their key paths (for yaml's type errors, which give only a
// line and the value).
type lines struct {
	root *yaml.Node
}

// lineOf is the line of key, or of its nearest ancestor in the document;
// 0 when not even the first key is there.
func (l lines) lineOf(key []string) int {
	n, line := l.root, 0
	if n != nil && n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	for _, k := range key {
		if n == nil || n.Kind != yaml.MappingNode {
			return line
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				line, next = n.Content[i].Line, n.Content[i+1]
				break
			}
		}
		if next == nil {
			return line
		}
		n = next
	}
	return line
}

// keyAt is the key path of the value on line whose text is value, "" if
// none is.
func (l lines) keyAt(line int, value string) string {
	var walk func(n *yaml.Node, path []string) string
	walk = func(n *yaml.Node, path []string) string {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				if p := walk(c, path); p != "" {
					return p
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := append(path[:len(path):len(path)], k.Value)
				if v.Line == line && v.Kind == yaml.ScalarNode && v.Value == value {
					return strings.Join(p, ".")
				}
				if r := walk(v, p); r != "" {
					return r
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := append(path[:len(path):len(path)], strconv.Itoa(i))
				if c.Line == line && c.Kind == yaml.ScalarNode && c.Value == value {
					return strings.Join(p, ".")
				}
				if r := walk(c, p); r != "" {
					return r
				}
			}
		}
		return ""
	}
	if l.root == nil {
		return ""
	}
	return walk(l.root, nil)
}

// locate prefixes a rule error with the line of its key.
func (l lines) locate(err error) error {
	var ke *keyError
	if errors.As(err, &ke) {
		if n := l.lineOf(ke.key); n > 0 {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return err
}

var (
	unknownFieldRE = regexp.MustCompile(`^line (\d+): field (\S+) not found in type (\S+)$`)
	wrongTypeRE    = regexp.MustCompile("^line (\\d+): cannot unmarshal !!(\\w+)(?: `(.*)`)? into (.+)$")
)

// yamlProblem rewrites one of yaml's decoding errors in the file's terms
// rather than Go's: the key, what was found and what is wanted.
func (l lines) yamlProblem(msg string) error {
	if m := unknownFieldRE.FindStringSubmatch(msg); m != nil {
		s := fmt.Sprintf("line %s: unknown key %q", m[1], m[2])
		if keys := knownKeys[m[3]]; len(keys) > 0 {
			if near := nearest(m[2], keys); near != "" {
				s += fmt.Sprintf(" (did you mean %s?)", near)
			} else {
				s += fmt.Sprintf(" (keys here: %s)", strings.Join(keys, ", "))
			}
		}
		return errors.New(s)
	}
	if m := wrongTypeRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		want, ok := goTypeWords[m[4]]
		if !ok {
			want = m[4]
		}
		if m[3] == "" { // a mapping or a list: yaml quotes no value
			return fmt.Errorf("line %d: %s where the key wants %s", line, yamlTagWords(m[2]), want)
		}
		where := ""
		if k := l.keyAt(line, m[3]); k != "" {
			where = k + ": "
		}
		return fmt.Errorf("line %d: %s%q is %s, want %s", line, where, m[3], yamlTagWords(m[2]), want)
	}
	return errors.New(msg)
}

// goTypeWords names the configuration's Go types as a YAML writer knows
// them.
var goTypeWords = map[string]string{
	"[]string":      "a list, like [orders, invoices]",
	"time.Duration": "a duration with its unit, like 30s or 1m",
	"int":           "a whole number",
	"bool":          "true or false",
	"string":        "a string",
}

func yamlTagWords(tag string) string {
	switch tag {
	case "str":
		return "a string"
	case "int", "float":
		return "a number"
	case "bool":
		return "a boolean"
	case "seq":
		return "a list"
	case "map":
		return "a mapping"
	}
	return "a " + tag
}

// knownKeys lists the YAML keys of each configuration type by the name
// yaml's errors give it ("relayserve.Limits").
var knownKeys = func() map[string][]string {
	m := map[string][]string{}
	for _, v := range []any{Config{}, Targets{}, Budget{}, TLS{}, Auth{}, Roles{}, Limits{}, Alarms{}} {
		t := reflect.TypeOf(v)
		var keys []string
		for i := range t.NumField() {
			if k, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); k != "" && k != "-" {
				keys = append(keys, k)
			}
		}
		m[t.String()] = keys
	}
	return m
}()

// nearest is the key within two edits of s ("bugdet" → "budget"), or "".
func nearest(s string, keys []string) string {
	best, bestD := "", 3
	for _, k := range keys {
		if d := editDistance(s, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Damerau (optimal string alignment) distance: a
// swapped pair of letters, the commonest typo, counts as one edit.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// flatten lists the errors an errors.Join holds, so each is its own
// problem (and gets its own line number).
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

var lineRE = regexp.MustCompile(`^line (\d+): `)

// lineNumber orders problems as the file does; those without a line
// (a required key that is absent, a rule across keys) come last.
func lineNumber(err error) int {
	if m := lineRE.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return math.MaxInt
}
