package relayapi

import (
	"os/exec"
	"strings"
	"testing"
)

// TestEdgedDeps: what edged must never link, each with its reason.
func TestEdgedDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/relay-dev/relay/cmd/edged").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	for pkg, why := range map[string]string{
		"github.com/aws/aws-sdk-go-v2/config":          "its STS, SSO, SSO-OIDC and sign-in clients cost every edged 4.6 MB of binary and 3 MiB of memory (defaultCredentials)",
		"github.com/aws/aws-sdk-go-v2/service/sts":     "the same",
		"github.com/aws/aws-sdk-go-v2/service/sso":     "the same",
		"github.com/aws/aws-sdk-go-v2/service/ssooidc": "the same",
		"testing": "a test dependency in a shipped binary",
		"github.com/relay-dev/relay/edge/relayapi/relayapitest": "the contract server is for tests",
	} {
		if deps[pkg] {
			t.Errorf("edged links %s: %s", pkg, why)
		}
	}
}
