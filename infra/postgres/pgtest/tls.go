package pgtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLS starts a cluster of tb's own, as Private does, whose server also
// listens on 127.0.0.1 with ssl=on: its certificate (for localhost and
// 127.0.0.1) is issued by a CA made for this cluster alone, whose PEM is
// CAFile, so a client with sslmode=verify-full and sslrootcert=CAFile
// verifies it and one with any other CA refuses it. The Unix socket stays
// (DSN, for the tests' own setup and checks). It skips or fails tb as Get
// does.
func TLS(tb testing.TB) *Cluster {
	tb.Helper()
	Get(tb)
	bin, _ := findBin()
	c, err := initCluster(bin, true, false)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	c.tls = true
	tb.Cleanup(func() {
		if err := c.stop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	ca, err := c.writeCerts()
	if err != nil {
		tb.Fatalf("pgtest: server certificate: %v", err)
	}
	c.caFile = ca
	// The port is free when chosen; the server binds it a moment later.
	// A clash (another process taking it meanwhile) fails the start with
	// the server's "could not bind" in the error, not a wrong answer.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	c.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if err := c.launch(); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return c
}

// CAFile is the PEM file of the CA that issued a TLS cluster's server
// certificate ("" for other clusters).
func (c *Cluster) CAFile() string { return c.caFile }

// TCPDSN is the connection string of database db over TCP to 127.0.0.1,
// as the superuser, with sslmode=verify-full and sslrootcert=ca: ca is
// CAFile to verify the server, any other CA to see it refused.
func (c *Cluster) TCPDSN(db, ca string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=verify-full sslrootcert=%s", c.port, superuser, db, ca)
}

// NewCA writes the PEM certificate of a new CA, one that issued nothing,
// into dir and returns its path: the wrong CA for any server.
func NewCA(dir string) (string, error) {
	ca, _, err := newCA("pgtest other CA")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "other-ca.crt")
	return path, os.WriteFile(path, pemBlock("CERTIFICATE", ca.Raw), 0o644)
}

func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// writeCerts writes the CA (ca.crt) and the server's certificate and key
// (server.crt, server.key: owned by the server's user, the key 0600 as
// the server demands) into the cluster's directory, and returns ca.crt.
func (c *Cluster) writeCerts() (string, error) {
	ca, caKey, err := newCA("pgtest CA")
	if err != nil {
		return "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", err
	}
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"ca.crt", pemBlock("CERTIFICATE", ca.Raw), 0o644},
		{"server.crt", pemBlock("CERTIFICATE", der), 0o644},
		{"server.key", pemBlock("PRIVATE KEY", keyDER), 0o600},
	}
	for _, f := range files {
		path := filepath.Join(c.dir, f.name)
		if err := os.WriteFile(path, f.data, f.mode); err != nil {
			return "", err
		}
		if c.cred != nil {
			if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return "", err
			}
		}
	}
	return filepath.Join(c.dir, "ca.crt"), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
