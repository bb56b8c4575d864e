package ledger

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// prohibitedImports may not be imported by non-test code anywhere under
// edge/ except the exempt directories: the relay path (scheduler order,
// back-off, ledger, segment store, executor) must be reproducible from its
// inputs, so it has no random source at all.
var prohibitedImports = map[string]string{
	"math/rand":    "PRNG in the relay path",
	"math/rand/v2": "PRNG in the relay path",
	"crypto/rand":  "randomness in the relay path (key generation belongs in edge/pki, TLS in edge/transport)",
}

// exemptDirs legitimately need randomness: edge/pki generates keys and
// serial numbers with crypto/rand; edge/transport runs TLS.
var exemptDirs = []string{"pki", "transport"}

// exemptFiles may import crypto/rand, each for the reason given; nothing
// else in their packages may.
var exemptFiles = map[string]string{
	// One draw per edged.db, when the database is created: the epoch of
	// the holdings reporter's idempotency keys, which must differ from a
	// rebuilt predecessor's so the relay never takes a new batch for a
	// replay of an old one. Nothing scheduled or retried depends on it.
	"relayapi/state.go": "the idempotency-key epoch of a new edged.db",
}

// clockFreeDirs must not read the wall clock: every ledger operation takes
// now from its caller, which is what makes pending order and back-off a
// function of the ledger's contents and the given time.
var clockFreeDirs = []string{"ledger"}

// TestNoPRNGInRelayPath scans the sources of edge/ for prohibited symbols.
func TestNoPRNGInRelayPath(t *testing.T) {
	root := filepath.Join("..")
	scanned := map[string]int{}
	seen := map[string]bool{} // exempt files found
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		top := strings.Split(filepath.ToSlash(rel), "/")[0]
		if d.IsDir() {
			for _, ex := range exemptDirs {
				if rel == ex {
					return filepath.SkipDir
				}
			}
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		scanned[top]++
		_, exempt := exemptFiles[filepath.ToSlash(rel)]
		seen[filepath.ToSlash(rel)] = exempt
		for _, v := range violations(t, path, contains(clockFreeDirs, top)) {
			if exempt && strings.Contains(v, ": imports crypto/rand: ") {
				continue
			}
			t.Errorf("%s: %s", filepath.ToSlash(filepath.Join("edge", rel)), v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for f := range exemptFiles {
		if !seen[f] {
			t.Errorf("edge/%s is exempt but no longer exists: remove it from exemptFiles", f)
		}
	}
	// Guard against a scan that silently covers nothing.
	for _, must := range []string{"ledger", "segstore"} {
		if scanned[must] == 0 {
			t.Errorf("scan found no sources in edge/%s", must)
		}
	}
	t.Logf("scanned non-test sources per package: %v", scanned)
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// violations parses one file and lists its prohibited imports and, when
// clockFree, its uses of time.Now / time.Since / time.Until.
func violations(t *testing.T, path string, clockFree bool) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return inspect(fset, f, clockFree)
}

func inspect(fset *token.FileSet, f *ast.File, clockFree bool) []string {
	var out []string
	timeName := ""
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if why, bad := prohibitedImports[p]; bad {
			out = append(out, fset.Position(imp.Pos()).String()+": imports "+p+": "+why)
		}
		if p == "time" {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	if clockFree && timeName != "" {
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == timeName {
				switch sel.Sel.Name {
				case "Now", "Since", "Until":
					out = append(out, fset.Position(sel.Pos()).String()+": reads the clock (time."+sel.Sel.Name+"); take now from the caller")
				}
			}
			return true
		})
	}
	return out
}

// TestScannerCatchesViolations proves the scanner can fail.
func TestScannerCatchesViolations(t *testing.T) {
	src := `package x
import (
	mr "math/rand/v2"
	clock "time"
)
var _ = mr.IntN
func f() { _ = clock.Now() }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := inspect(fset, f, true)
	if len(v) != 2 || !strings.Contains(v[0], "math/rand/v2") || !strings.Contains(v[1], "time.Now") {
		t.Fatalf("violations = %q", v)
	}
	if v := inspect(fset, f, false); len(v) != 1 {
		t.Fatalf("clock check ran outside clock-free dirs: %q", v)
	}
}
