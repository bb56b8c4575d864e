package takedown

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/relay-dev/relay/edge/pki"
)

// MaxClockSkew is how far after the verifier's clock a receipt's
// evicted_at may lie: devices' clocks drift, and pki.Issue backdates
// certificates by the same five minutes.
const MaxClockSkew = 5 * time.Minute

// MaxLineBytes bounds one line of a receipt file (a receipt with a chain
// of a few certificates is about 1.5 KiB), so a hostile file cannot make a
// verifier buffer without end.
const MaxLineBytes = 64 << 10

// maxChain bounds the certificates one receipt carries.
const maxChain = 8

// b64 is strict: a character's unused low bits must be zero, so a changed
// trailing character cannot decode to the same bytes.
var b64 = base64.StdEncoding.Strict()

// Signed is a receipt with its node's signature and certificate chain
// (leaf first). Build one with Sign or ParseLine; the zero value is not
// valid.
type Signed struct {
	Receipt   Receipt
	Signature []byte
	Chain     [][]byte // DER certificates, the node's first

	canonical []byte
}

// Canonical returns the signed bytes.
func (s Signed) Canonical() []byte { return bytes.Clone(s.canonical) }

// Sign signs r with cert's private key (an ECDSA or Ed25519 crypto.Signer,
// as tls.X509KeyPair loads it) and attaches cert's chain. cert.Leaf must be
// set and name r.Node (pki.NodeID): a node signs only its own receipts.
func Sign(r Receipt, cert tls.Certificate) (Signed, error) {
	msg, err := r.Canonical()
	if err != nil {
		return Signed{}, fmt.Errorf("sign receipt: %w", err)
	}
	if cert.Leaf == nil || len(cert.Certificate) == 0 {
		return Signed{}, fmt.Errorf("sign receipt: certificate not parsed")
	}
	if len(cert.Certificate) > maxChain {
		return Signed{}, fmt.Errorf("sign receipt: chain of %d certificates, at most %d", len(cert.Certificate), maxChain)
	}
	id, err := pki.NodeID(cert.Leaf)
	if err != nil {
		return Signed{}, fmt.Errorf("sign receipt: %w", err)
	}
	if id != r.Node {
		return Signed{}, fmt.Errorf("sign receipt: %w: certificate is node %q's, receipt node %q's", ErrNode, id, r.Node)
	}
	signer, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return Signed{}, fmt.Errorf("sign receipt: private key %T cannot sign", cert.PrivateKey)
	}
	var sig []byte
	switch signer.Public().(type) {
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(msg)
		// No random source: RFC 6979 deterministic signatures, so the same
		// receipt always has the same bytes, and edge/ has no randomness
		// outside pki and transport (ledger's TestNoPRNGInRelayPath).
		sig, err = signer.Sign(nil, sum[:], crypto.SHA256)
	case ed25519.PublicKey:
		sig, err = signer.Sign(nil, msg, crypto.Hash(0))
	default:
		return Signed{}, fmt.Errorf("sign receipt: %w: %T keys are not supported (ECDSA or Ed25519)", ErrSignature, signer.Public())
	}
	if err != nil {
		return Signed{}, fmt.Errorf("sign receipt: %w", err)
	}
	chain := make([][]byte, len(cert.Certificate))
	for i, der := range cert.Certificate {
		chain[i] = bytes.Clone(der)
	}
	return Signed{Receipt: r, Signature: sig, Chain: chain, canonical: msg}, nil
}

// line is the JSON shape of one line of a receipt file; the field order is
// the encoding's key order.
type line struct {
	V         int      `json:"v"`
	Receipt   string   `json:"receipt"`
	Signature string   `json:"signature"`
	Chain     []string `json:"chain"`
}

// MarshalLine returns s as one line of a receipt file, without the line
// break.
func (s Signed) MarshalLine() []byte {
	l := line{V: 1, Receipt: string(s.canonical), Signature: b64.EncodeToString(s.Signature), Chain: make([]string, len(s.Chain))}
	for i, der := range s.Chain {
		l.Chain[i] = b64.EncodeToString(der)
	}
	b, err := json.Marshal(l)
	if err != nil {
		panic(err) // strings and an int always marshal
	}
	return b
}

// ParseLine reads one line of a receipt file (without its line break). It
// checks the form only: call Verify to check the signature and
// certificate. A line that is not exactly MarshalLine's encoding of what
// it decodes to is ErrMalformed.
func ParseLine(b []byte) (Signed, error) {
	if len(b) > MaxLineBytes {
		return Signed{}, fmt.Errorf("%w: line of %d bytes, at most %d", ErrMalformed, len(b), MaxLineBytes)
	}
	var l line
	if err := json.Unmarshal(b, &l); err != nil {
		return Signed{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if l.V != 1 {
		return Signed{}, fmt.Errorf("%w: line version %d, want 1", ErrMalformed, l.V)
	}
	r, err := Parse([]byte(l.Receipt))
	if err != nil {
		return Signed{}, err
	}
	sig, err := b64.DecodeString(l.Signature)
	if err != nil || len(sig) == 0 {
		return Signed{}, fmt.Errorf("%w: signature is not base64", ErrMalformed)
	}
	if len(l.Chain) == 0 || len(l.Chain) > maxChain {
		return Signed{}, fmt.Errorf("%w: %d certificates, want 1..%d", ErrMalformed, len(l.Chain), maxChain)
	}
	s := Signed{Receipt: r, Signature: sig, Chain: make([][]byte, len(l.Chain)), canonical: []byte(l.Receipt)}
	for i, c := range l.Chain {
		if s.Chain[i], err = b64.DecodeString(c); err != nil || len(s.Chain[i]) == 0 {
			return Signed{}, fmt.Errorf("%w: certificate %d is not base64", ErrMalformed, i)
		}
	}
	if !bytes.Equal(s.MarshalLine(), b) {
		return Signed{}, fmt.Errorf("%w: line is not in canonical form", ErrMalformed)
	}
	return s, nil
}

// Verify checks s against the CA certificates in roots (see the package
// doc for every rule) with now as the verifier's clock, and returns the
// verified chain, leaf first. Every refusal wraps one of the package's
// errors.
func Verify(s Signed, roots *x509.CertPool, now time.Time) ([]*x509.Certificate, error) {
	r := s.Receipt
	if len(s.Chain) == 0 || len(s.Chain) > maxChain {
		return nil, fmt.Errorf("%w: %d certificates, want 1..%d", ErrMalformed, len(s.Chain), maxChain)
	}
	msg, err := r.Canonical()
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(msg, s.canonical) {
		return nil, fmt.Errorf("%w: receipt fields differ from the signed bytes", ErrMalformed)
	}
	leaf, err := x509.ParseCertificate(s.Chain[0])
	if err != nil {
		return nil, fmt.Errorf("%w: certificate: %v", ErrMalformed, err)
	}
	inter := x509.NewCertPool()
	for i, der := range s.Chain[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%w: certificate %d: %v", ErrMalformed, i+1, err)
		}
		inter.AddCert(c)
	}
	id, err := pki.NodeID(leaf)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNode, err)
	}
	if id != r.Node {
		return nil, fmt.Errorf("%w: certificate is node %q's, receipt names node %q", ErrNode, id, r.Node)
	}
	if leaf.KeyUsage != 0 && leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return nil, fmt.Errorf("%w: key usage lacks digital signature", ErrUsage)
	}
	var chain []*x509.Certificate
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		chains, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: r.EvictedAt, KeyUsages: []x509.ExtKeyUsage{u}})
		if err != nil {
			var inv x509.CertificateInvalidError
			if errors.As(err, &inv) && inv.Reason == x509.IncompatibleUsage {
				return nil, fmt.Errorf("%w: %v", ErrUsage, err)
			}
			return nil, fmt.Errorf("%w: at evicted_at %s: %v", ErrChain, r.EvictedAt.UTC().Format(time.RFC3339), err)
		}
		chain = chains[0]
	}
	var algo x509.SignatureAlgorithm
	switch leaf.PublicKey.(type) {
	case *ecdsa.PublicKey:
		algo = x509.ECDSAWithSHA256
	case ed25519.PublicKey:
		algo = x509.PureEd25519
	default:
		return nil, fmt.Errorf("%w: %T keys are not supported (ECDSA or Ed25519)", ErrSignature, leaf.PublicKey)
	}
	if err := leaf.CheckSignature(algo, s.canonical, s.Signature); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSignature, err)
	}
	if r.EvictedAt.After(now.Add(MaxClockSkew)) {
		return nil, fmt.Errorf("%w: evicted_at %s, now %s", ErrFuture, r.EvictedAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return chain, nil
}
