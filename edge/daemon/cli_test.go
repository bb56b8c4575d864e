package daemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/pki/pkitest"
)

// TestCheckConfigNamesTLSKeys: on a node's first start, a missing or bad
// certificate file is reported under the key that names it (tls.cert,
// tls.key, tls.ca), every failing file at once, as a configuration
// problem (exit 2); before, it read "tls: reload tls files: stat ...".
func TestCheckConfigNamesTLSKeys(t *testing.T) {
	pkiDir := pkitest.New(t, "a", "b")
	for _, tc := range []struct {
		name      string
		cert, key string
		ca        string
		want      []string
	}{
		{"cert and ca missing", "missing.crt", "a.key", "missing-ca.crt",
			[]string{"invalid config (2 problems)", "tls.cert: stat ", "missing.crt: no such file", "tls.ca: stat "}},
		{"key of another node", "a.crt", "b.key", "ca.crt", []string{"tls.key: load ", "private key does not match"}},
		{"key file holds a certificate", "a.crt", "a.crt", "ca.crt", []string{"tls.key: load ", "no PEM private key"}},
		{"certificate of another node", "b.crt", "b.key", "ca.crt", []string{"tls.cert: load ", `certificate is for node "b"`}},
		{"ca file holds a key", "a.crt", "a.key", "a.key", []string{"tls.ca: load ", "no PEM certificates"}},
		// A missing file does not hide what is wrong with another's content.
		{"cert missing and ca holds a key", "missing.crt", "a.key", "a.key",
			[]string{"invalid config (2 problems)", "tls.cert: stat ", "tls.ca: load ", "no PEM certificates"}},
		{"key and ca hold certificates and keys", "a.crt", "a.crt", "a.key",
			[]string{"invalid config (2 problems)", "tls.key: load ", "no PEM private key", "tls.ca: load ", "no PEM certificates"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "edged.yaml")
			doc := "node_id: a\ntls:\n  cert: " + filepath.Join(pkiDir, tc.cert) + "\n  key: " + filepath.Join(pkiDir, tc.key) +
				"\n  ca: " + filepath.Join(pkiDir, tc.ca) + "\nstorage: {dir: data}\n"
			if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), []string{"-check-config", "-config", path}, &stdout, &stderr, nil, "test")
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr %s", code, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// TestCheckConfigRelayAPI: -check-config reads relay_api.ca as it reads
// the TLS files (a missing or empty file is a problem under its key, exit
// 2) and prints the effective relay_api settings, or that it is off.
func TestCheckConfigRelayAPI(t *testing.T) {
	pkiDir := pkitest.New(t, "a")
	base := "node_id: a\ntls:\n  cert: " + filepath.Join(pkiDir, "a.crt") + "\n  key: " + filepath.Join(pkiDir, "a.key") +
		"\n  ca: " + filepath.Join(pkiDir, "ca.crt") + "\nstorage: {dir: data}\n"
	for _, tc := range []struct {
		name, extra string
		code        int
		out         string
	}{
		{"off", "", 0, "relay_api: off"},
		{"on", "relay_api: {url: 'https://relay:8443', ca: " + filepath.Join(pkiDir, "ca.crt") + "}\n", 0,
			"relay_api: url=https://relay:8443 auth=mtls ca=" + filepath.Join(pkiDir, "ca.crt") + " region= report_interval=30s report_delay=2s order_interval=30s batch=500"},
		{"system roots", "relay_api: {url: 'https://x.lambda-url.eu-west-1.on.aws/', auth: sigv4, region: eu-west-1}\n", 0, "ca=system roots region=eu-west-1"},
		{"ca missing", "relay_api: {url: 'https://relay:8443', ca: missing.crt}\n", 2, "relay_api.ca: open "},
		{"ca holds a key", "relay_api: {url: 'https://relay:8443', ca: " + filepath.Join(pkiDir, "a.key") + "}\n", 2, "relay_api.ca: " + filepath.Join(pkiDir, "a.key") + ": no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "edged.yaml")
			if err := os.WriteFile(path, []byte(base+tc.extra), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), []string{"-check-config", "-config", path}, &stdout, &stderr, nil, "test")
			if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
				t.Fatalf("exit %d, want %d with %q:\n%s%s", code, tc.code, tc.out, stdout.String(), stderr.String())
			}
		})
	}
}

// A storage.dir that is a regular file is a problem under its key at
// -check-config (and at start), not an error at start that names none.
func TestCheckConfigStorageDirIsFile(t *testing.T) {
	pkiDir := pkitest.New(t, "a")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "edged.yaml")
	doc := "node_id: a\ntls:\n  cert: " + filepath.Join(pkiDir, "a.crt") + "\n  key: " + filepath.Join(pkiDir, "a.key") +
		"\n  ca: " + filepath.Join(pkiDir, "ca.crt") + "\nstorage: {dir: data}\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"-check-config", "-config", path}, &stdout, &stderr, nil, "test"); code != 2 ||
		!strings.Contains(stderr.String(), "storage.dir: ") || !strings.Contains(stderr.String(), "is a file, want a directory") {
		t.Fatalf("exit %d, stderr %q; want 2 and the problem under storage.dir", code, stderr.String())
	}
}
