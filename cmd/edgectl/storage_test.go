package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/rpc"
)

// TestStorageLines: edgectl storage tells a new store from one whose
// previous run crashed (a first start was reported "unclean (crash, kill
// or power loss)"), and says that the count of hashed segments takes pack
// records with segment files (it said "segment files").
func TestStorageLines(t *testing.T) {
	for _, c := range []struct {
		s    rpc.Storage
		want string
	}{
		{rpc.Storage{PreviousStop: "none"}, "none (a new store)"},
		{rpc.Storage{PreviousStop: "clean", PreviousStopClean: true}, "clean"},
		{rpc.Storage{PreviousStopClean: true}, "clean"}, // a daemon older than previous_stop
		{rpc.Storage{PreviousStop: "unclean"}, "unclean (crash, kill or power loss)"},
		{rpc.Storage{}, "unclean (crash, kill or power loss)"},
	} {
		if got := stopLine(c.s); got != c.want {
			t.Errorf("stopLine(%+v) = %q, want %q", c.s, got, c.want)
		}
	}
	if got, want := verifiedLine(3), "3 segments hashed (segment files and pack records count alike)"; got != want {
		t.Errorf("verifiedLine(3) = %q, want %q", got, want)
	}
}

// TestPKIExistsNamesForce: running the README's walkthrough a second time
// stops at pki init because the CA exists; the error must name the flag
// that replaces it (it said "use overwrite", the library's option).
func TestPKIExistsNamesForce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	for _, args := range [][]string{{"pki", "init", dir}, {"pki", "issue", "a", "--usage", "node", "--dir", dir}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 0 {
			t.Fatalf("first %v: exit %d: %s", args, code, errOut.String())
		}
		out.Reset()
		if code := run(context.Background(), args, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "--force") ||
			strings.Contains(errOut.String(), "overwrite") {
			t.Fatalf("second %v: exit %d, stderr %q: want a failure that names --force", args, code, errOut.String())
		}
		if code := run(context.Background(), append(args, "--force"), &out, &errOut); code != 0 {
			t.Fatalf("%v --force: exit %d: %s", args, code, errOut.String())
		}
	}
}
