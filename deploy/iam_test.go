package deploy

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"
)

// statement is one IAM statement with its location in the template.
type statement struct {
	where     string
	actions   []string
	resources []string
	raw       map[string]any
}

// policyStatements collects every IAM statement the template declares:
// SAM function Policies (inline documents only; SAM policy templates and
// managed policy names hide their actions, so they are refused), IAM role
// inline policies and AWS::IAM::Policy resources.
func policyStatements(t *testing.T, raw map[string]any) []statement {
	t.Helper()
	var out []statement
	addDoc := func(where string, doc any) {
		for i, s := range at(t, doc, "Statement").([]any) {
			m := s.(map[string]any)
			if m["Effect"] != "Allow" {
				t.Errorf("%s statement %d: Effect %v; only Allow statements are expected", where, i, m["Effect"])
			}
			if _, ok := m["NotAction"]; ok {
				t.Errorf("%s statement %d uses NotAction", where, i)
			}
			if _, ok := m["NotResource"]; ok {
				t.Errorf("%s statement %d uses NotResource", where, i)
			}
			out = append(out, statement{
				where:     where + "#" + strings.TrimSpace(stringOr(m["Sid"], "")),
				actions:   strs(t, at(t, m, "Action")),
				resources: strs(t, at(t, m, "Resource")),
				raw:       m,
			})
		}
	}
	for id, r := range at(t, raw, "Resources").(map[string]any) {
		res := r.(map[string]any)
		props, _ := res["Properties"].(map[string]any)
		switch res["Type"] {
		case "AWS::Serverless::Function":
			policies, ok := props["Policies"].([]any)
			if !ok {
				t.Errorf("%s has no Policies list: without one SAM grants nothing and the function cannot reach its tables", id)
				continue
			}
			for _, p := range policies {
				doc, ok := p.(map[string]any)
				if _, hasStatement := doc["Statement"]; !ok || !hasStatement {
					t.Errorf("%s: policy %v is not an inline policy document (SAM policy templates and managed policies grant more than the function uses)", id, p)
					continue
				}
				addDoc(id, doc)
			}
		case "AWS::IAM::Role":
			for _, p := range props["Policies"].([]any) {
				addDoc(id, at(t, p, "PolicyDocument"))
			}
			if _, ok := props["ManagedPolicyArns"]; ok {
				t.Errorf("%s attaches managed policies", id)
			}
		case "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy":
			addDoc(id, at(t, props, "PolicyDocument"))
		}
	}
	return out
}

func stringOr(v any, def string) string {
	if s, ok := v.(string); ok {
		return s
	}
	return def
}

// allowedResources maps each granted action to the resources it may name.
// Anything else is a test failure: widening a grant must be a reviewed
// change to this table, not a quiet edit of the template.
var allowedResources = map[string][]string{
	"dynamodb:GetItem": {"${SourceTable.Arn}", "${TargetTable.Arn}"},
	// Target records are read in batches (enqueue, fires, operators).
	"dynamodb:BatchGetItem":       {"${SourceTable.Arn}"},
	"dynamodb:Query":              {"${SourceTable.Arn}", "${TargetTable.Arn}", "${SourceTable.Arn}/index/due"},
	"dynamodb:PutItem":            {"${SourceTable.Arn}", "${TargetTable.Arn}"},
	"dynamodb:DeleteItem":         {"${SourceTable.Arn}", "${TargetTable.Arn}"},
	"dynamodb:ConditionCheckItem": {"${SourceTable.Arn}", "${TargetTable.Arn}"},
	// Delivered outbox pages are deleted loosely (relaycore.LooseDeleter).
	"dynamodb:BatchWriteItem": {"${SourceTable.Arn}"},
	// Schedule names are data (one per alarm), so the grant is every
	// schedule in the dedicated group and nothing outside it.
	"scheduler:CreateSchedule": {"arn:${AWS::Partition}:scheduler:${AWS::Region}:${AWS::AccountId}:schedule/${RelayScheduleGroup}/*"},
	"iam:PassRole":             {"${SchedulerRole.Arn}"},
	"lambda:InvokeFunction":    nil, // the fire function's ARN; filled in by the test
}

func TestNoWildcardGrants(t *testing.T) {
	raw := loadRaw(t)
	fire := fireARN(t)
	allowed := map[string][]string{}
	for a, r := range allowedResources {
		allowed[a] = r
	}
	allowed["lambda:InvokeFunction"] = []string{fire}
	stmts := policyStatements(t, raw)
	if len(stmts) == 0 {
		t.Fatal("no IAM statements found")
	}
	for _, s := range stmts {
		for _, a := range s.actions {
			if strings.Contains(a, "*") || strings.Contains(a, "?") {
				t.Errorf("%s: wildcard action %q", s.where, a)
				continue
			}
			ok, known := allowed[a]
			if !known {
				t.Errorf("%s: action %q is not in the reviewed list (allowedResources)", s.where, a)
				continue
			}
			for _, r := range s.resources {
				if r == "*" || strings.HasPrefix(r, "*") {
					t.Errorf("%s: %s on resource %q", s.where, a, r)
				}
				if !slices.Contains(ok, r) {
					t.Errorf("%s: %s on %q, allowed only on %v", s.where, a, r, ok)
				}
			}
		}
		if slices.Contains(s.actions, "iam:PassRole") {
			cond, _ := s.raw["Condition"].(map[string]any)
			eq, _ := cond["StringEquals"].(map[string]any)
			if eq["iam:PassedToService"] != "scheduler.amazonaws.com" {
				t.Errorf("%s: iam:PassRole without Condition StringEquals iam:PassedToService scheduler.amazonaws.com", s.where)
			}
		}
	}
}

// schedulerRole returns the one role that EventBridge Scheduler may assume.
func schedulerRole(t *testing.T, raw map[string]any) map[string]any {
	t.Helper()
	var found []string
	var role map[string]any
	for id, r := range at(t, raw, "Resources").(map[string]any) {
		res := r.(map[string]any)
		if res["Type"] != "AWS::IAM::Role" {
			continue
		}
		for _, s := range at(t, res, "Properties", "AssumeRolePolicyDocument", "Statement").([]any) {
			svc, _ := at(t, s, "Principal").(map[string]any)["Service"]
			if svc != nil && slices.Contains(strs(t, svc), "scheduler.amazonaws.com") {
				found = append(found, id)
				role = res
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("roles assumable by scheduler.amazonaws.com: %v, want exactly one", found)
	}
	return role
}

func TestSchedulerRoleInvokesOnlyFire(t *testing.T) {
	raw := loadRaw(t)
	role := schedulerRole(t, raw)
	trust := at(t, role, "Properties", "AssumeRolePolicyDocument", "Statement").([]any)
	if len(trust) != 1 {
		t.Fatalf("scheduler role has %d trust statements, want 1", len(trust))
	}
	if got := at(t, trust[0], "Condition", "StringEquals", "aws:SourceAccount"); got != "${AWS::AccountId}" {
		t.Errorf("trust condition aws:SourceAccount = %v, want this account (confused deputy)", got)
	}
	var actions, targets []string
	for _, p := range at(t, role, "Properties", "Policies").([]any) {
		for _, s := range at(t, p, "PolicyDocument", "Statement").([]any) {
			actions = append(actions, strs(t, at(t, s, "Action"))...)
			targets = append(targets, strs(t, at(t, s, "Resource"))...)
		}
	}
	sort.Strings(actions)
	if !slices.Equal(slices.Compact(actions), []string{"lambda:InvokeFunction"}) {
		t.Errorf("scheduler role actions = %v, want only lambda:InvokeFunction", actions)
	}
	fire := fireARN(t)
	for _, r := range targets {
		if r != fire {
			t.Errorf("scheduler role may invoke %q; only the fire function %q is allowed", r, fire)
		}
	}
	// No other function shares the fire function's name.
	for id, fn := range resources(t, raw, "AWS::Serverless::Function") {
		if name, ok := props(fn)["FunctionName"].(string); ok && id != fireFunctionID && arnPrefix+name == fire {
			t.Errorf("%s has the fire function's name", id)
		}
	}
}

// TestOnlyFireIsInvoked: lambda:InvokeFunction is granted to exactly
// three principals, the scheduler role (alarm schedules), the fire
// function itself (continuations) and the api function (the fast kick),
// each on the fire function's ARN and nothing else; the sweep and ops
// functions may invoke no function, and no resource-based permission lets
// anything else invoke the fire function.
func TestOnlyFireIsInvoked(t *testing.T) {
	raw := loadRaw(t)
	fire := fireARN(t)
	holders := map[string]bool{}
	for _, s := range policyStatements(t, raw) {
		owner, _, _ := strings.Cut(s.where, "#")
		for _, a := range s.actions {
			if !strings.HasPrefix(a, "lambda:") {
				continue
			}
			if a != "lambda:InvokeFunction" {
				t.Errorf("%s: %s; the only Lambda action granted is lambda:InvokeFunction", s.where, a)
			}
			holders[owner] = true
			for _, r := range s.resources {
				if r != fire {
					t.Errorf("%s: lambda:InvokeFunction on %q; only the fire function %q", s.where, r, fire)
				}
			}
		}
	}
	role := ""
	for id, r := range at(t, raw, "Resources").(map[string]any) {
		if r.(map[string]any)["Type"] == "AWS::IAM::Role" && holders[id] {
			role = id
		}
	}
	want := []string{fireFunctionID, "ApiFunction"}
	if role != "" {
		want = append(want, role)
	}
	var got []string
	for h := range holders {
		got = append(got, h)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) || role != "SchedulerRole" {
		t.Errorf("lambda:InvokeFunction granted to %v, want exactly ApiFunction, FireFunction and SchedulerRole", got)
	}
	for id, r := range at(t, raw, "Resources").(map[string]any) {
		if r.(map[string]any)["Type"] == "AWS::Lambda::Permission" {
			t.Errorf("%s: a resource-based invoke permission; the fire function is invoked only by the scheduler role and itself", id)
		}
	}
	// Lambda's recursive loop detection is the outer guard on a chain of
	// continuations; turning it off would leave only the hop counter.
	props := at(t, raw, "Resources", fireFunctionID, "Properties").(map[string]any)
	if v, ok := props["RecursiveLoop"]; ok && v != "Terminate" {
		t.Errorf("FireFunction RecursiveLoop = %v; keep Lambda's loop detection on (Terminate)", v)
	}
}

// TestCallerPolicyExample: since October 2025 a new AWS_IAM function URL
// needs both lambda:InvokeFunctionUrl and lambda:InvokeFunction from its
// callers; the example policy in docs/deploy.md must grant both on the
// same resource, or a caller copying it gets 403.
func TestCallerPolicyExample(t *testing.T) {
	doc := readDoc(t, "docs/deploy.md")
	var examples int
	for _, block := range strings.Split(doc, "```json\n")[1:] {
		body, _, _ := strings.Cut(block, "```")
		if !strings.Contains(body, "lambda:Invoke") {
			continue
		}
		examples++
		var policy struct{ Statement []map[string]any }
		if err := json.Unmarshal([]byte(body), &policy); err != nil {
			t.Fatalf("example policy is not JSON: %v\n%s", err, body)
		}
		granted := map[string][]string{}
		for _, s := range policy.Statement {
			if s["Effect"] != "Allow" {
				continue
			}
			for _, r := range strs(t, s["Resource"]) {
				granted[r] = append(granted[r], strs(t, s["Action"])...)
			}
		}
		for r, actions := range granted {
			for _, want := range []string{"lambda:InvokeFunctionUrl", "lambda:InvokeFunction"} {
				if !slices.Contains(actions, want) {
					t.Errorf("example policy grants %v on %s, without %s", actions, r, want)
				}
			}
		}
	}
	if examples == 0 {
		t.Error("docs/deploy.md has no example caller policy for the function URL")
	}
}
