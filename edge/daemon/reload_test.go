package daemon

import (
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/wire"
)

func copyInto(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func leafOf(t *testing.T, path string) *x509.Certificate {
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
	return c
}

// TestCertificateReloadAfterFailureLogged: b's certificate is renewed by
// replacing the crt before the key. The handshake between the two writes
// fails the reload (the key does not match) and b logs that it keeps the
// previous certificate; the next handshake after the key is written puts
// the new certificate in use. That used to be silent, so the last line
// logged said the old certificate was still in use. Now it is logged once
// ("certificate reloaded; now in use", its serial and not_after),
// counted in edged_certificate_reloads_total, and
// edged_certificate_not_after_timestamp_seconds says which certificate
// is in use. Real TLS handshakes on 127.0.0.1.
func TestCertificateReloadAfterFailureLogged(t *testing.T) {
	dir := pkitest.New(t, "a", "b")
	bRelay, bRPC := listen(t), listen(t)
	cfg := nodeConfig(t, dir, "b", bRelay.Addr().String(), bRPC.Addr().String(), nil)
	cfg.AcceptFrom = []string{"a"}
	var logs logBuffer
	b := startNode(t, cfg, bRelay, bRPC, func(o *Options) { o.Log = slog.New(slog.NewTextHandler(&logs, nil)) })
	old := leafOf(t, cfg.TLS.Cert)
	if got := testutil.ToFloat64(b.d.met.certNotAfter); got != float64(old.NotAfter.Unix()) {
		t.Fatalf("not_after gauge at start %v, want %d", got, old.NotAfter.Unix())
	}

	// The renewal, made aside with the same CA and a longer validity so
	// that its NotAfter differs from the old one's.
	next := t.TempDir()
	copyInto(t, filepath.Join(dir, pki.CACertFile), filepath.Join(next, pki.CACertFile))
	copyInto(t, filepath.Join(dir, pki.CAKeyFile), filepath.Join(next, pki.CAKeyFile))
	if _, err := pki.Issue(next, "b", pki.Options{Usage: pki.UsageNode, Validity: 2 * 365 * 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	renewed := leafOf(t, filepath.Join(next, "b.crt"))

	copyInto(t, filepath.Join(next, "b.crt"), cfg.TLS.Cert) // the crt first
	rawSenderVersion(t, dir, b, wire.Version).Close()       // a handshake: the reload fails
	if n := testutil.ToFloat64(b.d.met.reloadErrors); n != 1 {
		t.Fatalf("reload errors %v after the crt alone changed, want 1", n)
	}
	copyInto(t, filepath.Join(next, "b.key"), cfg.TLS.Key)
	for range 3 { // the next handshake picks the pair up; later ones find it unchanged
		rawSenderVersion(t, dir, b, wire.Version).Close()
	}

	if n := testutil.ToFloat64(b.d.met.reloads); n != 1 {
		t.Errorf("edged_certificate_reloads_total %v, want 1", n)
	}
	if got := testutil.ToFloat64(b.d.met.certNotAfter); got != float64(renewed.NotAfter.Unix()) {
		t.Errorf("not_after gauge %v, want the renewed certificate's %d (old %d)", got, renewed.NotAfter.Unix(), old.NotAfter.Unix())
	}
	log := logs.String()
	failed := strings.Index(log, "certificate reload failed; keeping the previous certificate")
	loaded := strings.Index(log, `msg="certificate reloaded; now in use"`)
	if failed < 0 || loaded < failed {
		t.Fatalf("want the failed reload logged, then the successful one; log:\n%s", log)
	}
	if n := strings.Count(log, `msg="certificate reloaded; now in use"`); n != 1 {
		t.Errorf("successful reload logged %d times, want once", n)
	}
	if !strings.Contains(log[loaded:], "serial="+renewed.SerialNumber.String()) {
		t.Errorf("the reload line does not name the renewed certificate's serial %s:\n%s", renewed.SerialNumber, log[loaded:])
	}
}
