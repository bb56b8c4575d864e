package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testdata/scan.json is a cut of a real govulncheck v1.9.0 -format json
// run on this module with go1.26.8: GO-2026-6603 and GO-2026-6809 called
// (symbol-level traces), GO-2026-6599 only in an imported package.
func readScan(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "scan.json"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func writeAccepted(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "accepted.txt")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name     string
		accepted string
		scan     string // default: testdata/scan.json
		code     int
		want     []string
		notWant  []string
	}{
		{
			name:     "every called vulnerability accepted",
			accepted: "# toolchain\nGO-2026-6603 fixed in go1.26.9\n\nGO-2026-6809 fixed in go1.26.10\n",
			code:     0,
			want:     []string{"accepted    GO-2026-6603 (stdlib@v1.26.8, fixed in v1.26.9): fixed in go1.26.9", "2 called (2 accepted), 1 more"},
			notWant:  []string{"GO-2026-6599"},
		},
		{
			name:     "a called vulnerability not accepted",
			accepted: "GO-2026-6603 fixed in go1.26.9\n",
			code:     1,
			want:     []string{"VULNERABLE  GO-2026-6809 (stdlib@v1.26.8, fixed in v1.26.10)", "2 called (1 accepted)"},
		},
		{
			name: "no list",
			code: 1,
			want: []string{"VULNERABLE  GO-2026-6603", "VULNERABLE  GO-2026-6809"},
		},
		{
			name:     "an acceptance nothing needs is listed, not failed",
			accepted: "GO-2026-6603 a\nGO-2026-6809 b\nGO-2026-6599 only imported, so not called\n",
			code:     0,
			want:     []string{"unused      GO-2026-6599"},
		},
		{
			name: "a clean scan",
			scan: `{"config":{"scanner_version":"v1.9.0","go_version":"go1.27.3","scan_level":"symbol"}}`,
			code: 0,
			want: []string{"0 called (0 accepted), 0 more"},
		},
		{
			name: "a scan below symbol level cannot tell called code",
			scan: `{"config":{"scanner_version":"v1.9.0","scan_level":"module"}}`,
			code: 1,
			want: []string{`scan level "module"`},
		},
		{name: "no govulncheck output", scan: " ", code: 2},
		{name: "not JSON", scan: "govulncheck: loading packages: exit status 1", code: 2},
		{name: "an ID that is not one", accepted: "CVE-2026-1 x\n", code: 2},
		{name: "an acceptance without a reason", accepted: "GO-2026-6603\n", code: 2},
		{name: "an ID twice", accepted: "GO-2026-6603 a\nGO-2026-6603 b\n", code: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scan := readScan(t)
			if tc.scan != "" {
				scan = []byte(tc.scan)
			}
			var args []string
			if tc.accepted != "" {
				args = []string{"-accepted", writeAccepted(t, tc.accepted)}
			}
			var stdout, stderr bytes.Buffer
			code := run(args, bytes.NewReader(scan), &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
		})
	}
}
