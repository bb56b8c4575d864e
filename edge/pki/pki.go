// Package pki encodes edge node identity in X.509 certificates and issues a
// development PKI: one CA and certificates signed by it (what `edgectl pki
// init` and `edgectl pki issue` run): node certificates for edge agents,
// which both dial and accept, and server-only or client-only ones for
// relay serve and its callers (Usage).
//
// A node's identity is exactly one URI SAN of the form
//
//	spiffe://relay/node/<node-id>
//
// where <node-id> satisfies wire.CheckNodeID. The form is SPIFFE-shaped so
// that operators with a real SPIFFE or corporate CA can issue compatible
// certificates; nothing here depends on SPIFFE software. DNS and IP SANs
// are never used for authentication, because devices move between
// addresses. The node id itself is also a DNS SAN (ServerName): clients
// send it as the TLS server name, which lets a third-party client use its
// library's standard host-name verification before checking the URI.
//
// The dev CA is for getting started: keys are plain files (0600) and there
// is no revocation. Production fleets should issue certificates from their
// own CA with the same URI form.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/relay-dev/relay/edge/wire"
)

// Identity URI parts: spiffe://relay/node/<id>.
const (
	uriScheme = "spiffe"
	uriHost   = "relay"
	uriPrefix = "/node/"
)

// File names inside a PKI directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// Sentinel errors.
var (
	// ErrExists: a file Issue or InitCA would write already exists and
	// Options.Overwrite is not set. Nothing was written.
	ErrExists = errors.New("file exists")
	// ErrNoNodeID: a certificate carries no node identity URI, or more than
	// one, so it names no single node.
	ErrNoNodeID = errors.New("certificate names no single node id")
)

// NodeURI is the identity URI for a node id. It does not validate id.
func NodeURI(id string) *url.URL {
	return &url.URL{Scheme: uriScheme, Host: uriHost, Path: uriPrefix + id}
}

// NodeID returns the node id a certificate names: its single URI SAN of the
// form spiffe://relay/node/<id> with a valid id. Other URI SANs are ignored;
// two identity URIs, or none, is ErrNoNodeID.
func NodeID(cert *x509.Certificate) (string, error) {
	var ids []string
	for _, u := range cert.URIs {
		if u.Scheme != uriScheme || u.Host != uriHost || !strings.HasPrefix(u.Path, uriPrefix) {
			continue
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || u.RawPath != "" {
			return "", fmt.Errorf("%w: malformed identity URI %q", ErrNoNodeID, u)
		}
		id := strings.TrimPrefix(u.Path, uriPrefix)
		if err := wire.CheckNodeID(id); err != nil {
			return "", fmt.Errorf("%w: %q: %v", ErrNoNodeID, u, err)
		}
		ids = append(ids, id)
	}
	if len(ids) != 1 {
		return "", fmt.Errorf("%w: %d identity URIs (subject %q)", ErrNoNodeID, len(ids), cert.Subject.CommonName)
	}
	return ids[0], nil
}

// ServerName is the TLS server name a client sends when it dials node id,
// and the DNS SAN Issue puts in the node's certificate for it, so that a
// client using its TLS library's standard verification (chain plus host
// name) accepts the right node by its id. It is id itself, or "" for an
// id that cannot be a host name: one that parses as an IP address (a
// client would match it against IP SANs) or has an empty label ("a..b").
//
// The host-name match is not the identity check: DNS names compare
// without regard to case, node ids do not. A client must still read the
// node id from the identity URI (NodeID) and compare it, as edged does.
func ServerName(id string) string {
	if net.ParseIP(id) != nil || strings.Contains(id, "..") {
		return ""
	}
	return id
}

// Usage is what a certificate Issue writes may authenticate as. A
// certificate valid for server auth lets whoever holds its key answer
// clients that trust the CA for the names it carries, so only a party
// that listens gets one: a client certificate that could also serve
// would let any client pose as the server (for relay serve, on
// localhost, and collect its callers' bearer tokens). There is no
// default: each caller says which it issues.
type Usage int

const (
	usageUnset Usage = iota
	// UsageNode is an edge agent's certificate: edged both dials its
	// peers and accepts them, so it is valid for client and server auth,
	// with the node id and Options.Hosts (default localhost, 127.0.0.1)
	// as SANs. Certificates issued before Usage existed are of this
	// kind.
	UsageNode
	// UsageServer is a listener's certificate only (relay serve's): server
	// auth, with the node id and Options.Hosts (default localhost,
	// 127.0.0.1) as SANs.
	UsageServer
	// UsageClient is a caller's certificate only (a relay serve client's):
	// client auth, and no DNS or IP SANs unless Options.Hosts names some
	// (which cannot make it a server certificate: it is not valid for
	// server auth).
	UsageClient
)

// ParseUsage reads "node", "server" or "client".
func ParseUsage(s string) (Usage, error) {
	for _, u := range []Usage{UsageNode, UsageServer, UsageClient} {
		if s == u.String() {
			return u, nil
		}
	}
	return usageUnset, fmt.Errorf("certificate usage %q: want node (an edge agent: dials and accepts), server (a listener such as relay serve) or client (a caller of relay serve)", s)
}

func (u Usage) String() string {
	switch u {
	case UsageNode:
		return "node"
	case UsageServer:
		return "server"
	case UsageClient:
		return "client"
	}
	return fmt.Sprintf("Usage(%d)", int(u))
}

// extKeyUsage is the certificate's extended key usage.
func (u Usage) extKeyUsage() []x509.ExtKeyUsage {
	switch u {
	case UsageServer:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	case UsageClient:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
}

// Options tune InitCA and Issue. The zero value is usable for InitCA;
// Issue needs Usage.
type Options struct {
	// Usage is what the certificate Issue writes is for (required by
	// Issue; InitCA ignores it).
	Usage Usage
	// Overwrite replaces existing files; otherwise ErrExists.
	Overwrite bool
	// Validity of the certificate. Default: 10 years for a CA, 1 year for
	// a node.
	Validity time.Duration
	// Now is the issue time. Default: time.Now(). NotBefore is set five
	// minutes earlier to tolerate clock skew between devices.
	Now time.Time
	// Hosts become DNS or IP SANs of the certificate: the names a server
	// is dialled by. Default: "localhost" and "127.0.0.1" for UsageNode
	// and UsageServer, none for UsageClient.
	Hosts []string
}

func (o Options) times(defaultValidity time.Duration) (notBefore, notAfter time.Time) {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	v := o.Validity
	if v <= 0 {
		v = defaultValidity
	}
	return now.Add(-5 * time.Minute), now.Add(v)
}

// Paths are the files a call wrote.
type Paths struct {
	Cert, Key string
}

// InitCA creates a CA in dir (created 0700 if missing): ca.crt and ca.key,
// an ECDSA P-256 key written 0600. The CA can sign only end-entity
// certificates (path length 0).
func InitCA(dir string, opt Options) (Paths, error) {
	p := Paths{Cert: filepath.Join(dir, CACertFile), Key: filepath.Join(dir, CAKeyFile)}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, fmt.Errorf("init ca: %w", err)
	}
	nb, na := opt.times(10 * 365 * 24 * time.Hour)
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "relay edge dev CA", Organization: []string{"relay"}},
		NotBefore:             nb,
		NotAfter:              na,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := sign(tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return p, fmt.Errorf("init ca: %w", err)
	}
	if err := writePair(dir, p, der, key, opt.Overwrite); err != nil {
		return p, fmt.Errorf("init ca: %w", err)
	}
	return p, nil
}

// Issue creates <dir>/<nodeID>.crt and <dir>/<nodeID>.key, signed by the
// CA in dir, for opt.Usage (required): an edge node's certificate serves
// as both TLS server and client certificate, a server's and a client's as
// one only. Each carries the node identity URI and CommonName nodeID; a
// node's and a server's also nodeID as a DNS SAN (ServerName) and the
// hosts. The key (ECDSA P-256) is written 0600.
func Issue(dir, nodeID string, opt Options) (Paths, error) {
	p := Paths{Cert: filepath.Join(dir, nodeID+".crt"), Key: filepath.Join(dir, nodeID+".key")}
	if err := wire.CheckNodeID(nodeID); err != nil {
		return p, fmt.Errorf("issue %s: %w", nodeID, err)
	}
	switch opt.Usage {
	case UsageNode, UsageServer, UsageClient:
	default:
		return p, fmt.Errorf("issue %s: say what the certificate is for (Options.Usage): UsageNode, UsageServer or UsageClient", nodeID)
	}
	if nodeID == "ca" {
		return p, fmt.Errorf("issue %s: node id %q collides with the CA's files", nodeID, nodeID)
	}
	caCert, caKey, err := LoadCA(dir)
	if err != nil {
		return p, fmt.Errorf("issue %s: %w", nodeID, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, fmt.Errorf("issue %s: %w", nodeID, err)
	}
	nb, na := opt.times(365 * 24 * time.Hour)
	if na.After(caCert.NotAfter) {
		na = caCert.NotAfter // a chain is only valid while its CA is
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: nodeID, Organization: []string{"relay"}},
		NotBefore:   nb,
		NotAfter:    na,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: opt.Usage.extKeyUsage(),
		URIs:        []*url.URL{NodeURI(nodeID)},
	}
	if ServerName(nodeID) != "" && opt.Usage != UsageClient {
		tmpl.DNSNames = append(tmpl.DNSNames, nodeID)
	}
	hosts := opt.Hosts
	if len(hosts) == 0 && opt.Usage != UsageClient {
		hosts = []string{"localhost", "127.0.0.1"}
	}
	for _, h := range hosts {
		if h == nodeID {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := sign(tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return p, fmt.Errorf("issue %s: %w", nodeID, err)
	}
	if err := writePair(dir, p, der, key, opt.Overwrite); err != nil {
		return p, fmt.Errorf("issue %s: %w", nodeID, err)
	}
	return p, nil
}

// LoadCA reads the CA certificate and key from dir.
func LoadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, nil, fmt.Errorf("load ca: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("load ca: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || cb.Type != "CERTIFICATE" || kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, nil, fmt.Errorf("load ca: %s or %s is not PEM of the expected type", CACertFile, CAKeyFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("load ca: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("load ca: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, fmt.Errorf("load ca: key does not match %s", CACertFile)
	}
	if !cert.IsCA {
		return nil, nil, fmt.Errorf("load ca: %s is not a CA certificate", CACertFile)
	}
	return cert, key, nil
}

func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, priv *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	ski := sha256.Sum256(pubDER)
	tmpl.SubjectKeyId = ski[:20]
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, priv)
}

// writePair writes the certificate and key. Without overwrite it checks
// both names first and links each file into place (link fails if the name
// exists), so a concurrent writer cannot be clobbered either.
func writePair(dir string, p Paths, certDER []byte, key *ecdsa.PrivateKey, overwrite bool) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if !overwrite {
		for _, f := range []string{p.Cert, p.Key} {
			if _, err := os.Lstat(f); err == nil {
				return fmt.Errorf("%w: %s", ErrExists, f)
			} else if !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	// Key first: a crash between the two leaves a key without a
	// certificate, which nothing loads, rather than the reverse.
	if err := writeFile(p.Key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600, overwrite); err != nil {
		return err
	}
	if err := writeFile(p.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}), 0o644, overwrite); err != nil {
		if !overwrite {
			os.Remove(p.Key)
		}
		return err
	}
	return syncDir(dir)
}

// writeFile writes data to a temporary file, fsyncs it, then renames
// (overwrite) or links (no overwrite) it into place, so readers such as a
// running edged reloading its certificate never see a half-written file.
func writeFile(path string, data []byte, perm os.FileMode, overwrite bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if overwrite {
		return os.Rename(tmp, path)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %s", ErrExists, path)
		}
		return err
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
