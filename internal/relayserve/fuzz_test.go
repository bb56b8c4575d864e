package relayserve

import (
	"os"
	"path/filepath"
	"testing"
)

// classify never panics on a client's method and path, and labels every
// request with a route pattern or "unmatched" (the metrics' bounded label).
func FuzzClassify(f *testing.F) {
	for _, s := range []string{"/v1/sources/orders/rows", "/v1/sources/tenant%2F42/targets/t/skip", "/v1/sources/s/archive/007/requeue",
		"/v1/targets/t/items", "//", "/v1/sources/%zz/rows", ""} {
		f.Add("POST", s)
		f.Add("GET", s)
	}
	routes := apiRoutes()
	known := map[string]bool{unmatchedPattern: true}
	for _, r := range routes {
		known[r.Pattern] = true
	}
	f.Fuzz(func(t *testing.T, method, path string) {
		c := classify(routes, method, path)
		if !known[c.pattern] {
			t.Fatalf("%s %q labelled %q", method, path, c.pattern)
		}
		if c.need == needProduce && c.pattern == unmatchedPattern {
			t.Fatalf("%s %q: produce needed for no route", method, path)
		}
	})
}

// A tokens file of any content loads or fails with an error; it never
// panics, and every digest it accepts maps to a principal the
// configuration lists.
func FuzzTokensFile(f *testing.F) {
	_, line, _ := MintToken("app")
	f.Add([]byte(line + "\n# c\n\n"))
	f.Add([]byte("app sha256:00\n"))
	f.Add([]byte("a b c\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "tokens")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		known := map[string]Roles{"app": {Read: true}}
		byHash, _ := loadTokens(path, known)
		for _, name := range byHash {
			if _, ok := known[name]; !ok {
				t.Fatalf("accepted principal %q", name)
			}
		}
	})
}
