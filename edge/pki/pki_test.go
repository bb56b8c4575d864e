package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestInitCAAndIssue(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca, err := InitCA(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(t, ca.Key); m != 0o600 {
		t.Errorf("CA key mode %v, want 0600", m)
	}
	caCert := readCert(t, ca.Cert)
	if !caCert.IsCA || !caCert.MaxPathLenZero {
		t.Errorf("CA cert: IsCA=%v MaxPathLenZero=%v", caCert.IsCA, caCert.MaxPathLenZero)
	}
	if pub, ok := caCert.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("CA key is %T, want ECDSA P-256", caCert.PublicKey)
	}

	node, err := Issue(dir, "node-a", Options{Usage: UsageNode})
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(t, node.Key); m != 0o600 {
		t.Errorf("node key mode %v, want 0600", m)
	}
	cert := readCert(t, node.Cert)
	if id, err := NodeID(cert); err != nil || id != "node-a" {
		t.Fatalf("NodeID = %q, %v", id, err)
	}
	if got := cert.URIs[0].String(); got != "spiffe://relay/node/node-a" {
		t.Errorf("identity URI %s", got)
	}
	if !slices.Equal(cert.DNSNames, []string{"node-a", "localhost"}) || len(cert.IPAddresses) != 1 || cert.IPAddresses[0].String() != "127.0.0.1" {
		t.Errorf("default SANs: %v %v", cert.DNSNames, cert.IPAddresses)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("node cert does not verify for usage %v: %v", usage, err)
		}
	}
	if _, err := tls.LoadX509KeyPair(node.Cert, node.Key); err != nil {
		t.Errorf("node cert and key do not pair: %v", err)
	}
	if cert.NotAfter.After(caCert.NotAfter) {
		t.Error("node certificate outlives its CA")
	}
}

func TestIssueHostsAndValidity(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := InitCA(dir, Options{Now: now, Validity: 48 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	p, err := Issue(dir, "n1", Options{Usage: UsageNode, Now: now, Hosts: []string{"10.1.2.3", "edge-1.lan"}})
	if err != nil {
		t.Fatal(err)
	}
	c := readCert(t, p.Cert)
	if len(c.IPAddresses) != 1 || c.IPAddresses[0].String() != "10.1.2.3" || !slices.Equal(c.DNSNames, []string{"n1", "edge-1.lan"}) {
		t.Errorf("SANs %v %v", c.IPAddresses, c.DNSNames)
	}
	// One year asked for by default, but the CA expires after two days.
	if want := now.Add(48 * time.Hour); !c.NotAfter.Equal(want) {
		t.Errorf("NotAfter %v, want clamped to CA's %v", c.NotAfter, want)
	}
	if want := now.Add(-5 * time.Minute); !c.NotBefore.Equal(want) {
		t.Errorf("NotBefore %v, want %v", c.NotBefore, want)
	}
}

func TestRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	ca, err := InitCA(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(ca.Key)
	if _, err := InitCA(dir, Options{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second InitCA = %v, want ErrExists", err)
	}
	if after, _ := os.ReadFile(ca.Key); !bytes.Equal(before, after) {
		t.Fatal("CA key changed by a refused InitCA")
	}
	n, err := Issue(dir, "n", Options{Usage: UsageNode})
	if err != nil {
		t.Fatal(err)
	}
	certBefore, _ := os.ReadFile(n.Cert)
	if _, err := Issue(dir, "n", Options{Usage: UsageNode}); !errors.Is(err, ErrExists) {
		t.Fatalf("second Issue = %v, want ErrExists", err)
	}
	// Only the key exists (e.g. cert deleted by hand): still refused, and
	// the key is not replaced by one that no certificate matches.
	os.Remove(n.Cert)
	keyBefore, _ := os.ReadFile(n.Key)
	if _, err := Issue(dir, "n", Options{Usage: UsageNode}); !errors.Is(err, ErrExists) {
		t.Fatalf("Issue over a lone key = %v, want ErrExists", err)
	}
	if k, _ := os.ReadFile(n.Key); !bytes.Equal(k, keyBefore) {
		t.Fatal("lone key replaced")
	}
	if _, err := Issue(dir, "n", Options{Usage: UsageNode, Overwrite: true}); err != nil {
		t.Fatalf("Issue with Overwrite: %v", err)
	}
	if certAfter, _ := os.ReadFile(n.Cert); bytes.Equal(certAfter, certBefore) {
		t.Fatal("Overwrite did not replace the certificate")
	}
	if _, err := InitCA(dir, Options{Overwrite: true}); err != nil {
		t.Fatalf("InitCA with Overwrite: %v", err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*tmp*"))
	if len(leftovers) != 0 {
		t.Fatalf("temporary files left behind: %v", leftovers)
	}
}

func TestIssueRefusals(t *testing.T) {
	dir := t.TempDir()
	if _, err := Issue(dir, "n", Options{Usage: UsageNode}); err == nil {
		t.Fatal("Issue without a CA succeeded")
	}
	if _, err := InitCA(dir, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", "../evil", ".hidden", "a/b", "ca"} {
		if _, err := Issue(dir, id, Options{Usage: UsageNode}); err == nil {
			t.Errorf("Issue(%q) succeeded", id)
		}
	}
	// A CA key that does not match the certificate is refused.
	other := t.TempDir()
	if _, err := InitCA(other, Options{}); err != nil {
		t.Fatal(err)
	}
	k, _ := os.ReadFile(filepath.Join(other, CAKeyFile))
	os.WriteFile(filepath.Join(dir, CAKeyFile), k, 0o600)
	if _, err := Issue(dir, "n", Options{Usage: UsageNode}); err == nil {
		t.Fatal("Issue with a mismatched CA key succeeded")
	}
}

func TestNodeID(t *testing.T) {
	u := func(s string) *url.URL {
		v, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		uris []*url.URL
		want string
	}{
		{"one", []*url.URL{NodeURI("n1")}, "n1"},
		{"other URIs ignored", []*url.URL{u("https://example.com/x"), NodeURI("n1"), u("spiffe://other/node/n2")}, "n1"},
		{"none", nil, ""},
		{"two", []*url.URL{NodeURI("n1"), NodeURI("n2")}, ""},
		{"bad id", []*url.URL{NodeURI("a b")}, ""},
		{"nested path", []*url.URL{u("spiffe://relay/node/a/b")}, ""},
		{"query", []*url.URL{u("spiffe://relay/node/n1?x=1")}, ""},
		{"user", []*url.URL{u("spiffe://u@relay/node/n1")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := NodeID(&x509.Certificate{URIs: tc.uris})
			if tc.want == "" {
				if !errors.Is(err, ErrNoNodeID) {
					t.Fatalf("NodeID = %q, %v; want ErrNoNodeID", id, err)
				}
				return
			}
			if err != nil || id != tc.want {
				t.Fatalf("NodeID = %q, %v; want %q", id, err, tc.want)
			}
		})
	}
}

// TestNodeIDServerName: every node certificate carries its node id as a
// DNS SAN (the TLS server name clients send), except for ids that cannot
// be host names; the identity URI is there either way.
func TestNodeIDServerName(t *testing.T) {
	dir := t.TempDir()
	if _, err := InitCA(dir, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id       string
		dnsNames []string
	}{
		{"b", []string{"b", "localhost"}},
		{"Node_7.site-1", []string{"Node_7.site-1", "localhost"}},
		{"10.0.0.2", []string{"localhost"}}, // a client would match IP SANs
		{"a..b", []string{"localhost"}},     // empty label: not a host name
	} {
		p, err := Issue(dir, tc.id, Options{Usage: UsageNode})
		if err != nil {
			t.Fatal(err)
		}
		c := readCert(t, p.Cert)
		if !slices.Equal(c.DNSNames, tc.dnsNames) {
			t.Errorf("%s: DNS SANs %v, want %v", tc.id, c.DNSNames, tc.dnsNames)
		}
		if id, err := NodeID(c); err != nil || id != tc.id {
			t.Errorf("%s: NodeID %q, %v", tc.id, id, err)
		}
		if want := tc.dnsNames[0] == tc.id; (ServerName(tc.id) == tc.id) != want {
			t.Errorf("ServerName(%q) = %q", tc.id, ServerName(tc.id))
		}
	}
}

// Each usage gets the extended key usage and SANs it needs and no more: a
// client certificate is valid for client auth only and names no host; a
// server certificate serves only; a node certificate does both. Issue
// refuses to guess.
func TestIssueUsages(t *testing.T) {
	dir := t.TempDir()
	ca, err := InitCA(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(readCert(t, ca.Cert))
	if _, err := Issue(dir, "unsaid", Options{}); err == nil || !strings.Contains(err.Error(), "Usage") {
		t.Fatalf("Issue without a usage = %v, want a refusal naming Usage", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "unsaid.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused Issue wrote a key (%v)", err)
	}
	for _, tc := range []struct {
		usage          Usage
		opt            Options
		server, client bool
		dns            []string
		ips            int
	}{
		{UsageNode, Options{}, true, true, []string{"n-node", "localhost"}, 1},
		{UsageServer, Options{Hosts: []string{"relay.example", "10.0.0.5"}}, true, false, []string{"n-server", "relay.example"}, 1},
		{UsageClient, Options{}, false, true, nil, 0},
		{UsageClient, Options{Hosts: []string{"asked.example"}}, false, true, []string{"asked.example"}, 0},
	} {
		name := "n-" + tc.usage.String()
		tc.opt.Usage, tc.opt.Overwrite = tc.usage, true
		p, err := Issue(dir, name, tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		c := readCert(t, p.Cert)
		for _, u := range []struct {
			eku  x509.ExtKeyUsage
			want bool
		}{{x509.ExtKeyUsageServerAuth, tc.server}, {x509.ExtKeyUsageClientAuth, tc.client}} {
			_, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{u.eku}})
			if (err == nil) != u.want {
				t.Errorf("%s %v: verifies for %v: %v, want %v", tc.usage, tc.opt.Hosts, u.eku, err, u.want)
			}
		}
		if !slices.Equal(c.DNSNames, tc.dns) || len(c.IPAddresses) != tc.ips {
			t.Errorf("%s %v: SANs %v %v, want %v and %d IPs", tc.usage, tc.opt.Hosts, c.DNSNames, c.IPAddresses, tc.dns, tc.ips)
		}
		if id, err := NodeID(c); err != nil || id != name {
			t.Errorf("%s: NodeID %q, %v", tc.usage, id, err)
		}
	}
	for _, s := range []string{"node", "server", "client"} {
		if u, err := ParseUsage(s); err != nil || u.String() != s {
			t.Errorf("ParseUsage(%q) = %v, %v", s, u, err)
		}
	}
	if _, err := ParseUsage("both"); err == nil {
		t.Error(`ParseUsage("both") succeeded`)
	}
}

// A client's certificate and key cannot pose as the server: a TLS server
// on 127.0.0.1 presenting them fails the handshake of a client that
// trusts the CA, where a server certificate's passes.
func TestClientCertCannotServe(t *testing.T) {
	dir := t.TempDir()
	ca, err := InitCA(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(readCert(t, ca.Cert))
	for _, tc := range []struct {
		usage Usage
		ok    bool
	}{{UsageClient, false}, {UsageServer, true}, {UsageNode, true}} {
		name := "as-" + tc.usage.String()
		p, err := Issue(dir, name, Options{Usage: tc.usage, Hosts: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		kp, err := tls.LoadX509KeyPair(p.Cert, p.Key)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}()
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})
		if err == nil {
			conn.Close()
		}
		ln.Close()
		if (err == nil) != tc.ok {
			t.Errorf("a server presenting a %s certificate: handshake error %v, want success %v", tc.usage, err, tc.ok)
		}
	}
}
