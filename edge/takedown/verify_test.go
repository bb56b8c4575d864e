package takedown_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/takedown"
)

// fixture is a real dev PKI (edge/pki): nodes edge-a and edge-b, a client
// certificate and another CA that issued its own edge-b.
type fixture struct {
	dir, other string
	roots      *x509.CertPool
}

func newFixture(t testing.TB) fixture {
	dir := pkitest.New(t, "edge-a", "edge-b")
	pkitest.Issue(t, dir, "caller", pki.UsageClient)
	pkitest.Issue(t, dir, "listener", pki.UsageServer)
	other := pkitest.New(t, "edge-b")
	return fixture{dir: dir, other: other, roots: pool(t, dir)}
}

func pool(t testing.TB, dir string) *x509.CertPool {
	b, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatal("no CA")
	}
	return p
}

func keyPair(t testing.TB, dir, name string) tls.Certificate {
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func sign(t testing.TB, r takedown.Receipt, c tls.Certificate) takedown.Signed {
	t.Helper()
	s, err := takedown.Sign(r, c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestVerify(t *testing.T) {
	f := newFixture(t)
	// Certificates issued now; the receipt must fall in their lifetime.
	r := sample()
	r.EvictedAt = time.Now().UTC()
	at := r.EvictedAt.Add(time.Minute)
	b := keyPair(t, f.dir, "edge-b")
	a := keyPair(t, f.dir, "edge-a")
	good := sign(t, r, b)

	// Forgeries are built by hand: Sign refuses a certificate of another
	// node than the receipt's.
	withKey := func(cert tls.Certificate, key any) tls.Certificate { cert.PrivateKey = key; return cert }
	forge := func(r takedown.Receipt, signer tls.Certificate, chain [][]byte) takedown.Signed {
		t.Helper()
		r2 := r
		r2.Node = nodeOf(t, signer)
		s := sign(t, r2, signer)
		line := strings.Replace(string(s.MarshalLine()), `node=`+r2.Node+`\n`, `node=`+r.Node+`\n`, 1)
		line = strings.Replace(line, b64(s.Chain[0]), b64(chain[0]), 1)
		out, err := takedown.ParseLine([]byte(line))
		if err != nil {
			t.Fatalf("forge: %v", err)
		}
		return out
	}
	aKeyBCert := func() takedown.Signed {
		// edge-b's certificate, a signature by edge-a's key: Sign signs with
		// the key it is given, whatever certificate rides along.
		s, err := takedown.Sign(r, withKey(b, a.PrivateKey))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	// A CA and an edge-b certificate of three years ago, expired two years ago.
	past := time.Now().Add(-3 * 365 * 24 * time.Hour)
	oldDir := t.TempDir()
	if _, err := pki.InitCA(oldDir, pki.Options{Now: past}); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Issue(oldDir, "edge-b", pki.Options{Usage: pki.UsageNode, Now: past}); err != nil {
		t.Fatal(err)
	}
	oldRoots := pool(t, oldDir)
	expired := sign(t, r, keyPair(t, oldDir, "edge-b"))
	backThen := func() takedown.Signed {
		// Signed while the (now expired) certificate was valid: still verifies.
		r2 := r
		r2.EvictedAt = past.Add(time.Hour)
		return sign(t, r2, keyPair(t, oldDir, "edge-b"))
	}()
	future := func() takedown.Signed {
		r2 := r
		r2.EvictedAt = at.Add(takedown.MaxClockSkew + time.Second)
		return sign(t, r2, b)
	}()

	for _, tc := range []struct {
		name  string
		s     takedown.Signed
		want  error
		roots *x509.CertPool
	}{
		{"good", good, nil, nil},
		{"wrong key", aKeyBCert, takedown.ErrSignature, nil},
		{"another CA", sign(t, r, keyPair(t, f.other, "edge-b")), takedown.ErrChain, nil},
		{"another node's certificate", forge(r, a, a.Certificate), takedown.ErrNode, nil},
		{"another node's certificate, own key", forge(r, a, b.Certificate), takedown.ErrSignature, nil},
		{"client certificate", forge(withNode(r, "caller"), keyPair(t, f.dir, "caller"), keyPair(t, f.dir, "caller").Certificate), takedown.ErrUsage, nil},
		{"server certificate", forge(withNode(r, "listener"), keyPair(t, f.dir, "listener"), keyPair(t, f.dir, "listener").Certificate), takedown.ErrUsage, nil},
		{"certificate expired at evicted_at", expired, takedown.ErrChain, oldRoots},
		{"certificate valid at evicted_at, expired now", backThen, nil, oldRoots},
		{"dated in the future", future, takedown.ErrFuture, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			roots := f.roots
			if tc.roots != nil {
				roots = tc.roots
			}
			_, err := takedown.Verify(tc.s, roots, at)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

func withNode(r takedown.Receipt, n string) takedown.Receipt { r.Node = n; return r }

func nodeOf(t testing.TB, c tls.Certificate) string {
	id, err := pki.NodeID(c.Leaf)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func b64(der []byte) string {
	s := takedown.Signed{Signature: []byte{1}, Chain: [][]byte{der}}
	l := string(s.MarshalLine())
	i := strings.Index(l, `"chain":["`) + len(`"chain":["`)
	return l[i : len(l)-len(`"]}`)]
}

func TestSignRefusesAnotherNodesReceipt(t *testing.T) {
	f := newFixture(t)
	if _, err := takedown.Sign(withNode(sample(), "edge-a"), keyPair(t, f.dir, "edge-b")); !errors.Is(err, takedown.ErrNode) {
		t.Fatalf("Sign = %v, want ErrNode", err)
	}
}

// TestAnyChangedByteFails changes every byte of a receipt line, several
// ways each, and requires every result to be refused by ParseLine or
// Verify. Seeded; the seed is printed on failure.
func TestAnyChangedByteFails(t *testing.T) {
	f := newFixture(t)
	r := sample()
	r.EvictedAt = time.Now().UTC()
	at := r.EvictedAt.Add(time.Minute)
	line := sign(t, r, keyPair(t, f.dir, "edge-b")).MarshalLine()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	tried := 0
	for i := range line {
		for _, d := range []byte{0x01, 0x20, byte(1 + rng.IntN(255))} {
			mut := bytes.Clone(line)
			mut[i] ^= d
			tried++
			s, err := takedown.ParseLine(mut)
			if err == nil {
				_, err = takedown.Verify(s, f.roots, at)
			}
			if err == nil {
				t.Fatalf("seed %d: byte %d ^ %#x accepted: %q", seed, i, d, mut)
			}
		}
	}
	t.Logf("%d changed lines of %d bytes refused", tried, len(line))
}

// FuzzVerifyLine: whatever the input, a line that parses and verifies
// states exactly the receipt edge-b signed.
func FuzzVerifyLine(f *testing.F) {
	fx := newFixture(f)
	r := sample()
	r.EvictedAt = time.Now().UTC()
	at := r.EvictedAt.Add(time.Minute)
	line := sign(f, r, keyPair(f, fx.dir, "edge-b")).MarshalLine()
	f.Add(line)
	f.Add([]byte(`{"v":1,"receipt":"","signature":"","chain":[]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := takedown.ParseLine(in)
		if err != nil {
			return
		}
		if !bytes.Equal(s.MarshalLine(), in) {
			t.Fatalf("parsed a non-canonical line")
		}
		if _, err := takedown.Verify(s, fx.roots, at); err != nil {
			return
		}
		got := s.Receipt
		if got.Request != r.Request || got.ContentID != r.ContentID || got.SHA256 != r.SHA256 || got.Node != r.Node || !got.EvictedAt.Equal(r.EvictedAt) {
			t.Fatalf("verified a receipt nobody signed: %+v", got)
		}
	})
}

func TestVerifyAll(t *testing.T) {
	f := newFixture(t)
	r := sample()
	r.EvictedAt = time.Now().UTC()
	at := r.EvictedAt.Add(time.Minute)
	b := keyPair(t, f.dir, "edge-b")
	var file bytes.Buffer
	if err := takedown.WriteLines(&file, []takedown.Signed{sign(t, r, b), sign(t, withNode(r, "edge-a"), keyPair(t, f.dir, "edge-a"))}); err != nil {
		t.Fatal(err)
	}
	good := file.String()
	for _, tc := range []struct {
		name string
		in   string
		errs []bool
	}{
		{"two good", good, []bool{false, false}},
		{"empty file", "", nil},
		{"blank line between", strings.Replace(good, "\n", "\n\n", 1), []bool{false, true, false}},
		{"cut short", good[:len(good)-10], []bool{false, true}},
		{"no final break", strings.TrimSuffix(good, "\n"), []bool{false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := takedown.VerifyAll(strings.NewReader(tc.in), f.roots, at)
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != len(tc.errs) {
				t.Fatalf("%d results, want %d: %+v", len(res), len(tc.errs), res)
			}
			for i, want := range tc.errs {
				if (res[i].Err != nil) != want || res[i].Line != i+1 {
					t.Errorf("line %d: %+v, want refused %t", i+1, res[i], want)
				}
			}
		})
	}
	long := strings.Repeat("x", takedown.MaxLineBytes+10) + "\n"
	if _, err := takedown.VerifyAll(strings.NewReader(long), f.roots, at); !errors.Is(err, takedown.ErrMalformed) {
		t.Fatalf("long line: %v", err)
	}
}
