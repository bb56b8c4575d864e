package relaycli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docSubst are the shell variables the docs' commands use, as the set-up
// lines beside them define them.
var docSubst = map[string]string{
	"$SERVE": "--url https://relay.example:7480 --token-file /etc/relay/ops.token --ca /etc/relay/ca.crt",
}

// TestDocumentedCommandsParse: every relay command line the docs show
// (in sh blocks and in inline code) names a command that exists and only
// flags it takes, with values of the right type. Each runs as `relay ...
// --help`, which parses the flags and stops before doing anything.
func TestDocumentedCommandsParse(t *testing.T) {
	commands := map[string]bool{}
	for _, c := range newRoot(nil, &strings.Builder{}, &strings.Builder{}).Commands() {
		commands[c.Name()] = true
	}
	inline := regexp.MustCompile("`(relay [^`]+)`")
	n := 0
	for _, doc := range []string{"README.md", "docs/operations.md", "docs/serve.md", "docs/api.md", "docs/deploy.md", "docs/engine.md"} {
		b, err := os.ReadFile(filepath.Join("..", "..", doc))
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		inBlock := false
		var cont string
		for _, l := range strings.Split(string(b), "\n") {
			trimmed := strings.TrimSpace(l)
			if strings.HasPrefix(trimmed, "```") {
				inBlock = !inBlock
				continue
			}
			if inBlock {
				if cont != "" {
					trimmed = cont + " " + trimmed
					cont = ""
				}
				if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
					cont = s
					continue
				}
				if strings.HasPrefix(trimmed, "relay ") {
					lines = append(lines, trimmed)
				}
				continue
			}
			for _, m := range inline.FindAllStringSubmatch(l, -1) {
				// Prose that names a flag ("relay backup --url") is
				// not a whole command, nor is a log message quoted
				// ("relay serve: listening").
				if f := strings.Fields(m[1]); !strings.HasPrefix(f[len(f)-1], "-") && !strings.Contains(m[1]+" ", ": ") {
					lines = append(lines, m[1])
				}
			}
		}
		for _, line := range lines {
			args := docArgs(line)
			// Messages quoted in prose ("relay alarm failed") are not
			// commands.
			if len(args) < 2 || !commands[args[1]] {
				continue
			}
			// "relay target release|skip ...": each alternative.
			alts := []string{""}
			if len(args) > 2 {
				alts = strings.Split(args[2], "|")
			}
			for _, alt := range alts {
				a := append([]string(nil), args[1:]...)
				if alt != "" {
					a[1] = alt
				}
				n++
				// A parent command takes any words after it and
				// --help then shows its help: a misspelt subcommand
				// would pass, so the path must name a leaf.
				if c, rest, err := newRoot(nil, &strings.Builder{}, &strings.Builder{}).Find(a); err != nil ||
					(c.HasSubCommands() && len(rest) > 0 && !strings.HasPrefix(rest[0], "-")) {
					t.Errorf("%s: %q: no such command (%v)", doc, line, err)
					continue
				}
				var out, errb strings.Builder
				if code := Run(t.Context(), append(a, "--help"), &out, &errb); code != 0 {
					t.Errorf("%s: %q does not parse: %s", doc, line, errb.String())
				}
			}
		}
	}
	if n < 30 {
		t.Fatalf("found only %d documented relay commands", n)
	}
}

// docArgs splits a documented command line as sh would, enough for the
// docs: variables of docSubst expanded, $(...) kept as one word, quotes
// removed, a comment, pipe or redirection ending it.
func docArgs(line string) []string {
	for k, v := range docSubst {
		line = strings.ReplaceAll(line, k, v)
	}
	line = regexp.MustCompile(`\$\([^)]*\)`).ReplaceAllString(line, "SUBST")
	var args []string
	var cur strings.Builder
	inWord, quote := false, rune(0)
	flush := func() {
		if inWord {
			args = append(args, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			flush()
		case (r == '#' || r == '>' || r == '|' || r == '&' || r == ';') && !inWord:
			flush()
			return args
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	flush()
	return args
}
