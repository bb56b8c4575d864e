package relaycore_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// faceExceptions are the exported names that nothing else in the module
// names and no example uses, kept for a reason each. Besides these, a
// deprecated name (its doc has a "Deprecated:" paragraph; CHANGELOG.md says
// when it goes) and the errors of errors.go (what callers compare with
// errors.Is and errors.As, named by the docs of the calls that return them)
// need no use.
var faceExceptions = map[string]string{
	"ErrorClassHook":     "a value of LastError.Class, documented with ErrorClassApply (which infra/dynamo and relayserve name)",
	"ErrorClassRead":     "a value of LastError.Class, documented with ErrorClassApply",
	"ErrorClassTooLarge": "a value of LastError.Class, documented with ErrorClassApply",
	"KickNone":           "the zero CommitResult.Kick, documented with KickSent, KickPending and KickClaimed",
	"KickBackoff":        "a value of CommitResult.Kick (the api log's \"backoff\"), documented with KickSent, KickPending and KickClaimed",
}

// TestPublicFace keeps relaycore's API to what is used: every exported
// top-level name of the package must be named by another package of the
// module (tests included), by an embedder example (example_test.go), or
// appear in the exported fields and signatures of a name that is, or be one
// of the exceptions above. An exported name that nothing uses is a promise
// kept for nobody: unexport it, or move what relaycore/sim needs of the
// layout to relaycore/internal/layout.
func TestPublicFace(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	modPath := ""
	for line := range strings.Lines(string(mod)) {
		if p, ok := strings.CutPrefix(line, "module "); ok {
			modPath = strings.TrimSpace(p)
		}
	}
	pkgPath := modPath + "/relaycore"
	pkgDir := filepath.Join(root, "relaycore")
	fset := token.NewFileSet()

	face := exportedFace(t, fset, pkgDir)
	named := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != root && err == nil {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || (filepath.Dir(path) == pkgDir && d.Name() != "example_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		name := importName(f, pkgPath)
		if name == "" {
			return nil
		}
		if f, err = parser.ParseFile(fset, path, nil, parser.SkipObjectResolution); err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if s, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := s.X.(*ast.Ident); ok && x.Name == name {
					named[s.Sel.Name] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A used name makes the types in its exported surface used too.
	used := map[string]bool{}
	queue := []string{}
	for n, d := range face {
		if named[n] || d.exempt {
			used[n] = true
			queue = append(queue, n)
		}
	}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, e := range face[n].surface {
			ast.Inspect(e, func(x ast.Node) bool {
				if id, ok := x.(*ast.Ident); ok && face[id.Name] != nil && !used[id.Name] {
					used[id.Name] = true
					queue = append(queue, id.Name)
				}
				return true
			})
		}
	}
	var unused []string
	for n := range face {
		if !used[n] && faceExceptions[n] == "" {
			unused = append(unused, n)
		}
	}
	slices.Sort(unused)
	for _, n := range unused {
		t.Errorf("relaycore.%s (%s) is exported, but no other package, no example and no used API names it: unexport it, or move it to relaycore/internal/...",
			n, fset.Position(face[n].pos))
	}
	for n := range faceExceptions {
		switch d := face[n]; {
		case d == nil:
			t.Errorf("faceExceptions names %s, which relaycore no longer exports", n)
		case used[n]:
			t.Errorf("faceExceptions names %s, which is used: drop the exception", n)
		}
	}
	t.Logf("%d exported names, %d named outside the package or by an example", len(face), len(named))
}

// faceDecl is one exported top-level name of the package.
type faceDecl struct {
	pos     token.Pos
	exempt  bool       // deprecated, or an error of errors.go
	surface []ast.Expr // type expressions of its exported fields, methods and signature
}

// exportedFace parses the package's non-test files in dir.
func exportedFace(t *testing.T, fset *token.FileSet, dir string) map[string]*faceDecl {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	face := map[string]*faceDecl{}
	methods := map[string][]*ast.FuncDecl{}
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		errorsFile := n == "errors.go"
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv != nil {
					recv := receiverName(d.Recv.List[0].Type)
					methods[recv] = append(methods[recv], d)
					continue
				}
				face[d.Name.Name] = &faceDecl{pos: d.Pos(), exempt: deprecated(d.Doc), surface: []ast.Expr{d.Type}}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						doc := s.Doc
						if doc == nil && len(d.Specs) == 1 {
							doc = d.Doc
						}
						face[s.Name.Name] = &faceDecl{pos: s.Pos(), exempt: deprecated(doc) || errorsFile, surface: typeSurface(s.Type)}
					case *ast.ValueSpec:
						doc := s.Doc
						if doc == nil && len(d.Specs) == 1 {
							doc = d.Doc
						}
						for _, nm := range s.Names {
							if !nm.IsExported() {
								continue
							}
							fd := &faceDecl{pos: nm.Pos(), exempt: deprecated(doc) || errorsFile}
							if s.Type != nil {
								fd.surface = []ast.Expr{s.Type}
							}
							face[nm.Name] = fd
						}
					}
				}
			}
		}
	}
	for recv, ms := range methods {
		if d := face[recv]; d != nil {
			for _, m := range ms {
				d.surface = append(d.surface, m.Type)
			}
		}
	}
	return face
}

// typeSurface is what an importer sees of a type: the types of its
// exported fields and methods, or the whole type when it is not a struct
// or interface.
func typeSurface(e ast.Expr) []ast.Expr {
	var out []ast.Expr
	switch e := e.(type) {
	case *ast.StructType:
		for _, f := range e.Fields.List {
			if len(f.Names) == 0 || slices.ContainsFunc(f.Names, (*ast.Ident).IsExported) {
				out = append(out, f.Type)
			}
		}
	case *ast.InterfaceType:
		for _, f := range e.Methods.List {
			if len(f.Names) == 0 || slices.ContainsFunc(f.Names, (*ast.Ident).IsExported) {
				out = append(out, f.Type)
			}
		}
	default:
		out = append(out, e)
	}
	return out
}

func receiverName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

func deprecated(doc *ast.CommentGroup) bool {
	return doc != nil && (strings.HasPrefix(doc.Text(), "Deprecated: ") || strings.Contains(doc.Text(), "\nDeprecated: "))
}

// importName is the name f refers to pkgPath by, or "" when it does not
// import it (or imports it blank or with a dot).
func importName(f *ast.File, pkgPath string) string {
	for _, im := range f.Imports {
		if p, _ := strconv.Unquote(im.Path.Value); p != pkgPath {
			continue
		}
		if im.Name == nil {
			return filepath.Base(pkgPath)
		}
		if im.Name.Name != "_" && im.Name.Name != "." {
			return im.Name.Name
		}
	}
	return ""
}
