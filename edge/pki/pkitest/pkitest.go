// Package pkitest gives tests a dev CA and node certificates in a temp
// directory, made by the real edge/pki code (no canned certificates).
package pkitest

import (
	"testing"

	"github.com/relay-dev/relay/edge/pki"
)

// New creates a CA and a node certificate (pki.UsageNode: edge agents
// both dial and accept) for each node in t.TempDir() and returns the
// directory (ca.crt, <node>.crt, <node>.key).
func New(t testing.TB, nodes ...string) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := pki.InitCA(dir, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		Issue(t, dir, n, pki.UsageNode)
	}
	return dir
}

// Issue adds a certificate for name with usage to the CA in dir.
func Issue(t testing.TB, dir, name string, usage pki.Usage) {
	t.Helper()
	if _, err := pki.Issue(dir, name, pki.Options{Usage: usage}); err != nil {
		t.Fatal(err)
	}
}
