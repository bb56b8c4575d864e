package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// requireCfnLint names the variable that makes a missing cfn-lint a
// failure instead of a skip; .ci/run sets it, as does `make lint`'s caller
// in CI.
const requireCfnLint = "RELAY_REQUIRE_CFN_LINT"

// cfnLint runs cfn-lint the way `make lint` does: the SAM translator (what
// `sam validate --lint` runs) and informational checks included. It skips
// the test when cfn-lint is not installed, unless RELAY_REQUIRE_CFN_LINT is
// set.
func cfnLint(t *testing.T, template string) (string, error) {
	t.Helper()
	path, err := exec.LookPath("cfn-lint")
	if err != nil {
		if os.Getenv(requireCfnLint) != "" {
			t.Fatalf("cfn-lint not found and %s is set: %v", requireCfnLint, err)
		}
		t.Skipf("cfn-lint not installed (pip install cfn-lint); schema checks skipped, set %s=1 to require them", requireCfnLint)
	}
	cmd := exec.Command(path, "--format", "parseable", "--include-checks", "I", "--", template)
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestCfnLint: the template is valid against the resource schemas AWS
// maintains, with zero findings of any level.
func TestCfnLint(t *testing.T) {
	out, err := cfnLint(t, "template.yaml")
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("cfn-lint template.yaml: %v\n%s", err, out)
	}
}

// TestCfnLintSeesInformational: a copy of the template without the queue's
// explicit deletion policy must be reported (I3011), so a passing
// TestCfnLint means informational checks ran.
func TestCfnLintSeesInformational(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const policy = "  DeadLetterQueue:\n    Type: AWS::SQS::Queue\n    DeletionPolicy: Delete\n    UpdateReplacePolicy: Delete\n"
	if !strings.Contains(string(data), policy) {
		t.Fatalf("template.yaml no longer declares DeadLetterQueue as\n%s", policy)
	}
	broken := filepath.Join(t.TempDir(), "template.yaml")
	if err := os.WriteFile(broken, []byte(strings.Replace(string(data), policy, "  DeadLetterQueue:\n    Type: AWS::SQS::Queue\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := cfnLint(t, broken)
	if err == nil || !strings.Contains(out, "I3011") {
		t.Fatalf("cfn-lint on a queue without DeletionPolicy: err %v, want I3011 reported:\n%s", err, out)
	}
}
