package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
)

func fileSerial(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.String()
}

// handshakeSerials dials l with cli and returns the certificate serials
// each side saw of the other.
func handshakeSerials(t *testing.T, cli *Transport, l *Listener, peer string) (server, client string, err error) {
	t.Helper()
	accepted := acceptAsync(l)
	c, err := cli.Dial(context.Background(), l.Addr().String(), peer)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	res := <-accepted
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.conn.Close()
	server = c.NetConn().(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String()
	client = res.conn.NetConn().(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String()
	return server, client, nil
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReloadRotatesWithoutRestart: new certificates on disk are used by
// the next handshake, on both sides, with the same Transport and Listener.
func TestReloadRotatesWithoutRestart(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	srv := listen(t, newTransport(t, dir, "a", []string{"b"}, nil))
	cli := newTransport(t, dir, "b", []string{"a"}, nil)

	s1, c1, err := handshakeSerials(t, cli, srv, "a")
	if err != nil {
		t.Fatal(err)
	}
	if s1 != fileSerial(t, filepath.Join(dir, "a.crt")) || c1 != fileSerial(t, filepath.Join(dir, "b.crt")) {
		t.Fatal("first handshake did not use the files' certificates")
	}
	for _, n := range []string{"a", "b"} {
		if _, err := pki.Issue(dir, n, pki.Options{Usage: pki.UsageNode, Overwrite: true}); err != nil {
			t.Fatal(err)
		}
	}
	s2, c2, err := handshakeSerials(t, cli, srv, "a")
	if err != nil {
		t.Fatal(err)
	}
	if s2 == s1 || s2 != fileSerial(t, filepath.Join(dir, "a.crt")) {
		t.Errorf("server certificate: before %s, after %s, file %s", s1, s2, fileSerial(t, filepath.Join(dir, "a.crt")))
	}
	if c2 == c1 || c2 != fileSerial(t, filepath.Join(dir, "b.crt")) {
		t.Errorf("client certificate: before %s, after %s, file %s", c1, c2, fileSerial(t, filepath.Join(dir, "b.crt")))
	}
}

// TestReloadBadFilesKeepOldMaterial: broken or foreign replacements are
// refused and reported once per change; service continues on the old
// certificate; a good replacement then takes over.
func TestReloadBadFilesKeepOldMaterial(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	reported := make(chan error, 8)
	srvT := newTransport(t, dir, "a", []string{"b"}, func(c *Config) {
		c.OnReloadError = func(err error) { reported <- err }
	})
	srv := listen(t, srvT)
	cli := newTransport(t, dir, "b", []string{"a"}, nil)
	old := fileSerial(t, filepath.Join(dir, "a.crt"))
	goodCert, _ := os.ReadFile(filepath.Join(dir, "a.crt"))
	goodKey, _ := os.ReadFile(filepath.Join(dir, "a.key"))

	for _, tc := range []struct {
		name  string
		spoil func()
		want  string
	}{
		{"garbage certificate", func() {
			os.WriteFile(filepath.Join(dir, "a.crt"), []byte("not a certificate"), 0o644)
		}, "a.crt"},
		{"another node's certificate and key", func() {
			copyFile(t, filepath.Join(dir, "b.crt"), filepath.Join(dir, "a.crt"))
			copyFile(t, filepath.Join(dir, "b.key"), filepath.Join(dir, "a.key"))
		}, "node identity mismatch"},
		{"empty CA file", func() {
			os.WriteFile(filepath.Join(dir, "a.crt"), goodCert, 0o644)
			os.WriteFile(filepath.Join(dir, "a.key"), goodKey, 0o600)
			os.WriteFile(filepath.Join(dir, pki.CACertFile), nil, 0o644)
		}, "no PEM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spoil()
			for i := 0; i < 2; i++ {
				s, _, err := handshakeSerials(t, cli, srv, "a")
				if err != nil {
					t.Fatalf("handshake %d with broken files: %v", i, err)
				}
				if s != old {
					t.Fatalf("server switched to serial %s", s)
				}
			}
			select {
			case err := <-reported:
				if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "still using the previous certificate") {
					t.Fatalf("reported %v, want mention of %q", err, tc.want)
				}
			default:
				t.Fatal("reload error not reported")
			}
			select {
			case err := <-reported:
				t.Fatalf("same bad files reported twice: %v", err)
			default:
			}
			if err := srvT.rl.Err(); err == nil {
				t.Fatal("Err() is nil while files are broken")
			}
			if err := srvT.Reload(); err == nil {
				t.Fatal("explicit Reload of broken files succeeded")
			}
		})
	}

	// Repair with a whole new PKI in the same files; the client shares the
	// directory, so it picks up the new CA and certificate too.
	if _, err := pki.InitCA(dir, pki.Options{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if _, err := pki.Issue(dir, n, pki.Options{Usage: pki.UsageNode, Overwrite: true}); err != nil {
			t.Fatal(err)
		}
	}
	s, _, err := handshakeSerials(t, cli, srv, "a")
	if err != nil {
		t.Fatal(err)
	}
	if s == old || s != fileSerial(t, filepath.Join(dir, "a.crt")) {
		t.Fatalf("after repair server serial %s, want the new file's", s)
	}
	if err := srvT.rl.Err(); err != nil {
		t.Fatalf("Err() after repair: %v", err)
	}
}

// TestReloadCARotation: switching the CA file changes who is accepted on
// the next handshake.
func TestReloadCARotation(t *testing.T) {
	dir1 := pkitest.New(t, "a", "b")
	dir2 := pkitest.New(t, "a", "b")
	// The server's live files start as copies of CA1's.
	live := t.TempDir()
	for _, f := range []string{"a.crt", "a.key", pki.CACertFile} {
		copyFile(t, filepath.Join(dir1, f), filepath.Join(live, f))
	}
	srvT := newTransport(t, live, "a", []string{"b"}, nil)
	srv := listen(t, srvT)
	b1 := newTransport(t, dir1, "b", []string{"a"}, nil)
	b2 := newTransport(t, dir2, "b", []string{"a"}, nil)
	if _, _, err := handshakeSerials(t, b1, srv, "a"); err != nil {
		t.Fatalf("CA1 client before rotation: %v", err)
	}
	// Rotate file by file; each intermediate state is refused as a whole.
	for _, f := range []string{pki.CACertFile, "a.crt", "a.key"} {
		copyFile(t, filepath.Join(dir2, f), filepath.Join(live, f))
		srvT.Material() // a handshake-time check between the steps
	}
	if err := srvT.rl.Err(); err != nil {
		t.Fatalf("after the last file: %v", err)
	}
	if _, _, err := handshakeSerials(t, b2, srv, "a"); err != nil {
		t.Fatalf("CA2 client after rotation: %v", err)
	}
	accepted := acceptAsync(srv)
	if _, err := b1.Dial(context.Background(), srv.Addr().String(), "a"); err == nil {
		t.Fatal("CA1 client accepted after rotation to CA2")
	}
	srv.Close()
	if res := <-accepted; res.err == nil {
		res.conn.Close()
		t.Fatal("CA1 client reached Accept")
	}
}

func TestReloadUnchangedContentIsNoop(t *testing.T) {
	dir := pkitest.New(t, "a")
	rl, err := NewReloader("a", filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key"), filepath.Join(dir, pki.CACertFile), func(err error) {
		t.Errorf("unexpected reload error: %v", err)
	})
	if err != nil {
		t.Fatal(err)
	}
	m := rl.Current()
	// Rewrite the same bytes: timestamps change, content does not.
	copyFile(t, filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.crt"))
	if rl.Current() != m {
		t.Fatal("identical content produced new material")
	}
	if err := rl.Reload(); err != nil || rl.Current() != m {
		t.Fatalf("Reload of identical content: %v", err)
	}
}

// TestReloadMissingFileReportedOnce: a certificate file that disappears
// (a rotation script between its rm and its mv) keeps the old material
// and is reported once per change, like a bad file, not once per
// handshake: every inbound and outbound handshake would otherwise log an
// error and count a reload failure.
func TestReloadMissingFileReportedOnce(t *testing.T) {
	dir := pkitest.New(t, "a")
	var reported []error
	rl, err := NewReloader("a", filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key"), filepath.Join(dir, pki.CACertFile),
		func(err error) { reported = append(reported, err) })
	if err != nil {
		t.Fatal(err)
	}
	old := rl.Current()
	key := filepath.Join(dir, "a.key")
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 2; round++ {
		if err := os.Remove(key); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if m := rl.Current(); m != old {
				t.Fatal("material changed while the key file is missing")
			}
		}
		if len(reported) != round {
			t.Fatalf("round %d: %d reports, want %d (once per change): %v", round, len(reported), round, reported)
		}
		if rl.Err() == nil {
			t.Fatal("Err() is nil while the key file is missing")
		}
		if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if m := rl.Current(); m != old {
			t.Fatal("restored files changed the material")
		}
		if err := rl.Err(); err != nil {
			t.Fatalf("Err() after the file came back: %v", err)
		}
	}
}
