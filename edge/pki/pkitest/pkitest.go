// Package pkitest gives tests a dev CA and node certificates in a temp
// directory, made by the real edge/pki code (no canned certificates).
package pkitest

import (
	"testing"

	"github.com/relay-dev/relay/edge/pki"
)

// New creates a CA and a certificate for each node in t.TempDir() and
// returns the directory (ca.crt, <node>.crt, <node>.key).
func New(t testing.TB, nodes ...string) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := pki.InitCA(dir, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, err := pki.Issue(dir, n, pki.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
