package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/relay-dev/relay/infra/lambdainvoke"
	"github.com/relay-dev/relay/infra/scheduler"
	"github.com/relay-dev/relay/lambda/fire"
)

func readJSON(t *testing.T, rel string, v any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s is not valid JSON: %v", rel, err)
	}
}

func TestEventsAreJSON(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "events", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		var v any
		readJSON(t, filepath.Join("events", filepath.Base(f)), &v)
		if _, ok := v.(map[string]any); !ok {
			t.Errorf("%s: a Lambda event here is a JSON object, got %T", f, v)
		}
	}
	for _, want := range []string{"fire.json", "fire-continuation.json", "sweep.json", "api-enqueue.json", "api-query.json", "api-state.json", "api-watermark.json", "ops-targets.json", "malformed.json"} {
		if !slices.Contains(names, want) {
			t.Errorf("events/%s missing", want)
		}
	}
}

// decodeStrict decodes data into v refusing unknown fields, the way the
// functions are meant to validate their events.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// TestFireEventIsWhatSchedulerSends ties events/fire.json to the input the
// Kicker puts on every alarm schedule.
func TestFireEventIsWhatSchedulerSends(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "events", "fire.json"))
	if err != nil {
		t.Fatal(err)
	}
	var in scheduler.FireInput
	if err := decodeStrict(data, &in); err != nil {
		t.Fatalf("events/fire.json is not a scheduler.FireInput: %v", err)
	}
	if in.Source == "" {
		t.Error("events/fire.json has an empty source")
	}
	bad, err := os.ReadFile(filepath.Join(repoRoot, "events", "malformed.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m scheduler.FireInput
	if err := decodeStrict(bad, &m); err == nil && m.Source != "" {
		t.Error("events/malformed.json decodes as a valid fire event; it must exercise the error path")
	}
}

// TestContinuationEventIsWhatFireSends ties events/fire-continuation.json
// to the event the fire function sends itself, and to what it accepts.
func TestContinuationEventIsWhatFireSends(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "events", "fire-continuation.json"))
	if err != nil {
		t.Fatal(err)
	}
	var in lambdainvoke.Input
	if err := decodeStrict(data, &in); err != nil {
		t.Fatalf("events/fire-continuation.json is not a lambdainvoke.Input: %v", err)
	}
	if in.Source == "" || in.Hop < 1 || in.Hop > fire.MaxContinuationHops {
		t.Errorf("events/fire-continuation.json = %+v, want a source and hop 1..%d", in, fire.MaxContinuationHops)
	}
	if _, _, err := fire.ParseEvent(data); err != nil {
		t.Errorf("the fire function refuses events/fire-continuation.json: %v", err)
	}
}

// TestSweepEventMatchesSchedule checks events/sweep.json has the fields the
// template's ScheduleV2 Input sends (context attributes filled in).
func TestSweepEventMatchesSchedule(t *testing.T) {
	raw := loadRaw(t)
	var input string
	for name, e := range at(t, raw, "Resources", "SweepFunction", "Properties", "Events").(map[string]any) {
		if at(t, e, "Type") == "ScheduleV2" {
			s, ok := at(t, e, "Properties", "Input").(string)
			if !ok {
				t.Fatalf("sweep event %s has no string Input", name)
			}
			input = s
		}
	}
	var tmpl, sample map[string]any
	if err := json.Unmarshal([]byte(input), &tmpl); err != nil {
		t.Fatalf("ScheduleV2 Input %q is not JSON: %v", input, err)
	}
	readJSON(t, "events/sweep.json", &sample)
	keys := func(m map[string]any) []string {
		var k []string
		for key := range m {
			k = append(k, key)
		}
		sort.Strings(k)
		return k
	}
	if got, want := keys(sample), keys(tmpl); !slices.Equal(got, want) {
		t.Errorf("events/sweep.json fields %v, the schedule sends %v", got, want)
	}
	for k, v := range tmpl {
		s, _ := v.(string)
		if strings.HasPrefix(s, "<aws.scheduler.") && sample[k] == s {
			t.Errorf("events/sweep.json %s is the unfilled placeholder %q", k, s)
		}
	}
}

func TestAPIEventsAreFunctionURLRequests(t *testing.T) {
	for name, method := range map[string]string{
		"api-enqueue.json": "POST", "api-query.json": "GET", "api-state.json": "GET", "api-watermark.json": "GET",
		"ops-targets.json": "GET", // the operator API (OpsFunction)
	} {
		t.Run(name, func(t *testing.T) {
			var req events.LambdaFunctionURLRequest
			readJSON(t, filepath.Join("events", name), &req)
			if req.Version != "2.0" {
				t.Errorf("version %q, want 2.0 (function URL payload format)", req.Version)
			}
			if req.RequestContext.HTTP.Method != method {
				t.Errorf("method %q, want %s", req.RequestContext.HTTP.Method, method)
			}
			if req.RawPath == "" || req.RequestContext.HTTP.Path != req.RawPath {
				t.Errorf("rawPath %q and requestContext.http.path %q disagree", req.RawPath, req.RequestContext.HTTP.Path)
			}
			if a := req.RequestContext.Authorizer; a == nil || a.IAM == nil || a.IAM.UserARN == "" {
				t.Error("no IAM authorizer context: the URL uses AuthType AWS_IAM, so every request has one")
			}
			if method == "POST" {
				var body map[string]any
				if err := json.Unmarshal([]byte(req.Body), &body); err != nil {
					t.Errorf("body is not JSON: %v", err)
				}
			}
		})
	}
}

// TestEnvJSON checks env.json against the template: SAM local only applies
// variables the template declares, so an undeclared one would silently
// do nothing.
func TestEnvJSON(t *testing.T) {
	raw := loadRaw(t)
	var env map[string]map[string]string
	readJSON(t, "env.json", &env)
	global := at(t, raw, "Globals", "Function", "Environment", "Variables").(map[string]any)
	for id := range functionDirs {
		vars, ok := env[id]
		if !ok {
			t.Errorf("env.json has no %s section", id)
			continue
		}
		declared := map[string]bool{}
		for k := range global {
			declared[k] = true
		}
		if props, ok := at(t, raw, "Resources", id, "Properties").(map[string]any); ok {
			if e, ok := props["Environment"].(map[string]any); ok {
				for k := range e["Variables"].(map[string]any) {
					declared[k] = true
				}
			}
		}
		for k := range vars {
			if !declared[k] {
				t.Errorf("env.json %s.%s is not declared in template.yaml; sam local would ignore it", id, k)
			}
		}
		if p := vars["PLAN"]; p != "free" && p != "paid" {
			t.Errorf("env.json %s.PLAN = %q, want free or paid", id, p)
		}
	}
	for id := range env {
		if _, ok := functionDirs[id]; !ok && id != "Parameters" {
			t.Errorf("env.json section %q names no function", id)
		}
	}
}

func TestSAMConfig(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot, "samconfig.toml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	deploy := map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && section == "[default.deploy.parameters]" {
			deploy[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"capabilities":      `"CAPABILITY_IAM"`,
		"resolve_s3":        "true",
		"confirm_changeset": "true",
	} {
		if deploy[k] != want {
			t.Errorf("samconfig.toml deploy %s = %q, want %s", k, deploy[k], want)
		}
	}
	if po := deploy["parameter_overrides"]; !strings.Contains(po, `Plan=\"Free\"`) && !strings.Contains(po, `Plan=\"Paid\"`) {
		t.Errorf("samconfig.toml parameter_overrides %s does not set Plan to Free or Paid", po)
	}
}
