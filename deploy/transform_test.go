package deploy

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// samTransformPy expands template.yaml with the SAM translator, as `sam
// deploy` (and cfn-lint) do, into the CloudFormation template AWS runs.
// CodeUri is set to a placeholder S3 URI, as cfn-lint does, since the
// translator wants one.
const samTransformPy = `import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse
class Loader:
    def load(self):
        return {}
tpl = yaml_parse(open(sys.argv[1]).read())
for r in tpl.get("Resources", {}).values():
    if r.get("Type") == "AWS::Serverless::Function":
        r.setdefault("Properties", {})["CodeUri"] = "s3://bucket/key"
json.dump(transform(tpl, {}, Loader()), sys.stdout)
`

// translatorPython finds a Python that has the SAM translator: the one
// beside cfn-lint (a pyenv shim or a virtualenv's bin), else python3.
func translatorPython() (string, error) {
	var candidates []string
	if lint, err := exec.LookPath("cfn-lint"); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(lint), "python3"))
	}
	if py, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, py)
	}
	err := errors.New("no python3")
	for _, py := range candidates {
		if err = exec.Command(py, "-c", "import samtranslator").Run(); err == nil {
			return py, nil
		}
	}
	return "", err
}

// samTransform returns the transformed template; it skips the test when
// the SAM translator (installed with cfn-lint) is missing, unless
// RELAY_REQUIRE_CFN_LINT is set.
func samTransform(t *testing.T) map[string]any {
	t.Helper()
	py, err := translatorPython()
	if err != nil {
		if os.Getenv(requireCfnLint) != "" {
			t.Fatalf("the SAM translator (python3 -c 'import samtranslator') is missing and %s is set: %v", requireCfnLint, err)
		}
		t.Skipf("the SAM translator is not installed (it comes with cfn-lint): %v", err)
	}
	script := filepath.Join(t.TempDir(), "transform.py")
	if err := os.WriteFile(script, []byte(samTransformPy), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, script, "template.yaml")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "AWS_DEFAULT_REGION=us-east-1") // the translator wants a region
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("SAM transform: %v\n%s", err, msg)
	}
	var tpl map[string]any
	if err := json.Unmarshal(out, &tpl); err != nil {
		t.Fatal(err)
	}
	return tpl
}

// TestTransformedInvokeGrants: in the template SAM deploys (its generated
// roles included, which TestOnlyFireIsInvoked cannot see in the raw
// template), lambda:InvokeFunction is held by exactly the scheduler role,
// the fire and api functions' roles, on the fire function only, and the
// role SAM makes for the sweep's schedule, on the sweep function only; no
// resource-based permission lets anything else invoke a function.
// docs/deploy.md says so.
func TestTransformedInvokeGrants(t *testing.T) {
	tpl := samTransform(t)
	resources := tpl["Resources"].(map[string]any)
	on := map[string][]string{} // role -> the resources it may invoke
	for id, r := range resources {
		r := r.(map[string]any)
		switch r["Type"] {
		case "AWS::Lambda::Permission":
			t.Errorf("%s: a resource-based invoke permission", id)
		case "AWS::IAM::Role":
			props, _ := r["Properties"].(map[string]any)
			policies, _ := props["Policies"].([]any)
			for _, p := range policies {
				doc := p.(map[string]any)["PolicyDocument"].(map[string]any)
				for _, s := range doc["Statement"].([]any) {
					s := s.(map[string]any)
					raw, _ := json.Marshal(s["Action"])
					if !strings.Contains(string(raw), "lambda:") {
						continue
					}
					res, _ := json.Marshal(s["Resource"])
					on[id] = append(on[id], string(raw)+" on "+string(res))
				}
			}
		}
	}
	var holders []string
	for id := range on {
		holders = append(holders, id)
	}
	sort.Strings(holders)
	if want := []string{"ApiFunctionRole", "FireFunctionRole", "SchedulerRole", "SweepFunctionSweepRole"}; !slices.Equal(holders, want) {
		t.Errorf("Lambda actions granted to %v, want exactly %v", holders, want)
	}
	for id, grants := range on {
		for _, g := range grants {
			fire := strings.HasSuffix(g, `function:${AWS::StackName}-fire"}`)
			sweep := strings.HasSuffix(g, `{"Fn::GetAtt":["SweepFunction","Arn"]}`)
			if !strings.HasPrefix(g, `"lambda:InvokeFunction" on `) && !strings.HasPrefix(g, `["lambda:InvokeFunction"] on `) ||
				(id == "SweepFunctionSweepRole") != sweep || (id != "SweepFunctionSweepRole") != fire {
				t.Errorf("%s: %s", id, g)
			}
		}
	}
}
