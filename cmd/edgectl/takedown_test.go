package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/takedown"
)

// edgectl takedown verify checks a receipt file with only the CA
// certificate: exit 0 when every receipt verifies, 1 with the refused
// line named otherwise.
func TestTakedownVerify(t *testing.T) {
	dir := pkitest.New(t, "edge-b")
	other := pkitest.New(t)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "edge-b.crt"), filepath.Join(dir, "edge-b.key"))
	if err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	for _, req := range []string{"req-1", "req-2"} {
		s, err := takedown.Sign(takedown.Receipt{Request: req, ContentID: "seg-1", SHA256: strings.Repeat("0f", 32), Node: "edge-b", EvictedAt: time.Now()}, cert)
		if err != nil {
			t.Fatal(err)
		}
		file.Write(s.MarshalLine())
		file.WriteByte('\n')
	}
	good := file.Bytes()
	changed := bytes.Clone(good)
	changed[bytes.Index(changed, []byte("req-2"))+4] = '3'
	write := func(name string, b []byte) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, file, ca string
		code           int
		want           string
	}{
		{"good", write("good", good), dir, 0, "2 receipts verified"},
		{"changed byte", write("changed", changed), dir, 1, "line 2  REFUSED"},
		{"another CA", write("good", good), other, 1, "2 of 2 receipts refused"},
		{"empty", write("empty", nil), dir, 1, "holds no receipts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), []string{"takedown", "verify", tc.file, "--ca", filepath.Join(tc.ca, pki.CACertFile)}, &out, &errOut)
			if code != tc.code || !strings.Contains(out.String()+errOut.String(), tc.want) {
				t.Fatalf("exit %d, want %d; output %q %q, want %q", code, tc.code, out.String(), errOut.String(), tc.want)
			}
		})
	}
}
