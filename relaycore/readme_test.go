package relaycore_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestReadmeQuotesExample keeps the README's "Embedding the engine" snippet
// a verbatim copy of ExampleRelayHandler's body (one indent less, leading
// tabs as four spaces), so the README shows code that compiles and whose
// output go test checks.
func TestReadmeQuotesExample(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var body string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "ExampleRelayHandler" {
			body = string(src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset])
		}
	}
	if body == "" {
		t.Fatal("example_test.go has no ExampleRelayHandler")
	}
	var want []string
	for _, l := range strings.Split(strings.Trim(body, "\n"), "\n") {
		l = strings.TrimPrefix(l, "\t")
		tabs := len(l) - len(strings.TrimLeft(l, "\t"))
		want = append(want, strings.Repeat("    ", tabs)+l[tabs:])
	}

	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sect, ok := strings.Cut(string(readme), "\n## Embedding the engine\n")
	if !ok {
		t.Fatal(`README.md has no "## Embedding the engine" section`)
	}
	_, block, ok := strings.Cut(sect, "\n```go\n")
	if ok {
		block, _, ok = strings.Cut(block, "\n```\n")
	}
	if !ok {
		t.Fatal(`README.md's "Embedding the engine" has no go code block`)
	}
	if got := strings.Split(block, "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("README.md's embedding snippet differs from ExampleRelayHandler's body; paste this into README.md:\n%s", strings.Join(want, "\n"))
	}
}
