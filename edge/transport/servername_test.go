package transport

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/wire"
)

// thirdPartyConfig is what a client written against docs/wire.md with
// nothing but crypto/tls does: standard chain and host-name verification
// against the CA, the peer's node id as server name, its own certificate.
func thirdPartyConfig(t *testing.T, dir, self, serverName string) *tls.Config {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, self+".crt"), filepath.Join(dir, self+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: serverName, MinVersion: tls.VersionTLS13}
}

// TestThirdPartyClientByNodeID: a plain crypto/tls client that sends the
// node id as server name completes the handshake with an edged listener
// (the certificate carries the id as a DNS SAN), finds the id in the
// identity URI, and exchanges HELLO. Naming another node fails the
// host-name check. Before, only "localhost" passed.
func TestThirdPartyClientByNodeID(t *testing.T) {
	ctx := context.Background()
	dir := pkitest.New(t, "a", "node_b.site-1")
	srv := listen(t, newTransport(t, dir, "node_b.site-1", []string{"a"}, nil))
	accepted := acceptAsync(srv)

	tc, err := tls.Dial("tcp", srv.Addr().String(), thirdPartyConfig(t, dir, "a", "node_b.site-1"))
	if err != nil {
		t.Fatalf("third-party client naming the node id: %v", err)
	}
	defer tc.Close()
	if id, err := pki.NodeID(tc.ConnectionState().PeerCertificates[0]); err != nil || id != "node_b.site-1" {
		t.Fatalf("identity URI names %q, %v", id, err)
	}
	c := wire.NewConn(tc, wire.Options{})
	if err := c.SendHello(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if h, err := c.RecvHello(ctx); err != nil || h.NodeID != "node_b.site-1" {
		t.Fatalf("HELLO %+v, %v", h, err)
	}
	if res := <-accepted; res.err != nil || res.peer != "a" {
		t.Fatalf("Accept = %q, %v", res.peer, res.err)
	} else {
		res.conn.Close()
	}

	_, err = tls.Dial("tcp", srv.Addr().String(), thirdPartyConfig(t, dir, "a", "c"))
	if err == nil || !strings.Contains(err.Error(), "not c") {
		t.Fatalf("server name c accepted for node_b.site-1's certificate: %v", err)
	}
}

// TestDialSendsNodeIDAsServerName: edged's own dialer sends the peer's
// node id as server name, the rule docs/wire.md gives every client.
func TestDialSendsNodeIDAsServerName(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "b.crt"), filepath.Join(dir, "b.key"))
	if err != nil {
		t.Fatal(err)
	}
	sni := make(chan string, 1)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) { sni <- h.ServerName; return nil, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		c := wire.NewConn(nc, wire.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c.SendHello(ctx, "b") == nil {
			c.RecvHello(ctx)
		}
	}()
	c, err := newTransport(t, dir, "a", []string{"b"}, nil).Dial(context.Background(), ln.Addr().String(), "b")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-done
	if got := <-sni; got != "b" {
		t.Fatalf("server name %q, want the node id b", got)
	}
}

// TestCertificateWithoutNodeIDSAN: a certificate issued before node ids
// became DNS SANs (identity URI and localhost only) still works between
// edged nodes, which verify the chain and the URI, not host names.
func TestCertificateWithoutNodeIDSAN(t *testing.T) {
	ctx := context.Background()
	dir := pkitest.New(t, "a")
	oldStyleCert(t, dir, "b")
	srv := listen(t, newTransport(t, dir, "b", []string{"a"}, nil))
	accepted := acceptAsync(srv)
	c, err := newTransport(t, dir, "a", []string{"b"}, nil).Dial(ctx, srv.Addr().String(), "b")
	if err != nil {
		t.Fatalf("dial a node with an old-style certificate: %v", err)
	}
	c.Close()
	if res := <-accepted; res.err != nil || res.peer != "a" {
		t.Fatalf("Accept = %q, %v", res.peer, res.err)
	} else {
		res.conn.Close()
	}
}

// oldStyleCert writes <id>.crt/.key as pki.Issue did before it added the
// node id as a DNS SAN.
func oldStyleCert(t *testing.T, dir, id string) {
	t.Helper()
	caCert, caKey, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: id},
		NotBefore:    time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{pki.NodeURI(id)},
		DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*pem.Block{id + ".crt": {Type: "CERTIFICATE", Bytes: der}, id + ".key": {Type: "PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
