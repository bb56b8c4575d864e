// Package systemdtest has systemd itself check a shipped unit file
// (deploy/*.service) in a test, so a unit that systemd would refuse or
// warn about fails the build, not an operator's install.
package systemdtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Verify runs `systemd-analyze verify` on the unit file at unit, with
// every mention of installed (the path the unit runs, e.g.
// /usr/local/bin/edged) replaced by bin (the binary under test): verify
// refuses a unit whose executables do not exist. It fails the test on an
// error or on any output, since systemd reports unknown or misspelt
// settings as warnings with a zero exit. It skips the test where
// systemd-analyze is not installed.
func Verify(t testing.TB, unit, installed, bin string) {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	// verify takes the unit's name from the file name: keep it.
	path := filepath.Join(t.TempDir(), filepath.Base(unit))
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(b), installed, bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", path).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
