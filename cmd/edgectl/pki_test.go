package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// edgectl pki issue makes the caller say what the certificate is for and
// writes nothing until it does; a client certificate is valid for client
// auth only and names no host, so its holder cannot pose as a server.
func TestPKIIssueUsage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"pki", "init", dir}, &out, &errOut); code != 0 {
		t.Fatalf("pki init: exit %d: %s", code, errOut.String())
	}
	for _, args := range [][]string{{"pki", "issue", "app", "--dir", dir}, {"pki", "issue", "app", "--usage", "both", "--dir", dir}} {
		errOut.Reset()
		if code := run(context.Background(), args, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "usage") {
			t.Fatalf("%v: exit %d, stderr %q: want a refusal naming the usages", args, code, errOut.String())
		}
		if _, err := os.Stat(filepath.Join(dir, "app.key")); err == nil {
			t.Fatalf("%v wrote a key", args)
		}
	}
	for _, tc := range []struct {
		usage string
		eku   []x509.ExtKeyUsage
		dns   []string
	}{
		{"client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil},
		{"server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []string{"srv-server", "localhost"}},
		{"node", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, []string{"srv-node", "localhost"}},
	} {
		name := "srv-" + tc.usage
		if code := run(context.Background(), []string{"pki", "issue", name, "--usage", tc.usage, "--dir", dir}, &out, &errOut); code != 0 {
			t.Fatalf("issue --usage %s: exit %d: %s", tc.usage, code, errOut.String())
		}
		b, err := os.ReadFile(filepath.Join(dir, name+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.ExtKeyUsage, tc.eku) || !slices.Equal(c.DNSNames, tc.dns) {
			t.Errorf("--usage %s: extended key usage %v, DNS SANs %v; want %v, %v", tc.usage, c.ExtKeyUsage, c.DNSNames, tc.eku, tc.dns)
		}
	}
}
