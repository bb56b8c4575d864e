package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/relay-dev/relay/internal/systemdtest"
)

// TestSystemdUnit keeps deploy/edged.service honest: the settings the
// operator guide promises, and flags that edged really has.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("../../deploy/edged.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			unit[k] = append(unit[k], v)
		}
	}
	want := map[string]string{
		"Restart": "on-failure", "ExecReload": "/bin/kill -HUP $MAINPID", "KillSignal": "SIGTERM",
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"CapabilityBoundingSet": "", "User": "edged", "Group": "edged", "StateDirectory": "edged", "RuntimeDirectory": "edged",
		"ConfigurationDirectoryMode": "0750",
		"RestrictAddressFamilies":    "AF_INET AF_INET6 AF_UNIX", "MemoryDenyWriteExecute": "yes",
	}
	for k, v := range want {
		if got := unit[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s=%v, want %q", k, got, v)
		}
	}
	// A dynamic user cannot be given the node's key before its first start
	// (its group does not exist yet).
	if _, ok := unit["DynamicUser"]; ok {
		t.Error("DynamicUser is set: the key in /etc/edged could not be made readable by the service alone")
	}
	for _, key := range []string{"ExecStart", "ExecStartPre"} {
		if len(unit[key]) != 1 {
			t.Fatalf("%s: %v", key, unit[key])
		}
		args := strings.Fields(unit[key][0])[1:]
		// Run the same flags against a missing file: a flag edged does not
		// know exits 2 with "flag provided but not defined".
		for i, a := range args {
			if a == "/etc/edged/edged.yaml" {
				args[i] = "/nonexistent/edged.yaml"
			}
		}
		out, _ := exec.Command(bin.edged, args...).CombinedOutput()
		if strings.Contains(string(out), "not defined") || !strings.Contains(string(out), "/nonexistent/edged.yaml") {
			t.Errorf("%s flags %v: %s", key, args, out)
		}
	}
}

// TestSystemdAnalyzeVerify: systemd itself accepts the unit, with edged
// where the unit says (here the binary under test). Skipped where
// systemd-analyze is not installed.
func TestSystemdAnalyzeVerify(t *testing.T) {
	systemdtest.Verify(t, "../../deploy/edged.service", "/usr/local/bin/edged", bin.edged)
}
