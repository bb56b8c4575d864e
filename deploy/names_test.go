package deploy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// maxStackName is the longest stack name every physical name built from it
// fits (docs/deploy.md and README say so; TestStackNameLimit derives it).
const maxStackName = 57

// nameLimits is, per resource type, the property that sets its physical
// name, the service's length limit, and whether the name is unique per
// account (IAM) rather than per account and region.
var nameLimits = map[string]struct {
	prop   string
	max    int
	global bool
}{
	"AWS::Serverless::Function":     {"FunctionName", 64, false},
	"AWS::Lambda::Function":         {"FunctionName", 64, false},
	"AWS::Scheduler::ScheduleGroup": {"Name", 64, false},
	"AWS::Scheduler::Schedule":      {"Name", 64, false},
	"AWS::Logs::LogGroup":           {"LogGroupName", 512, false},
	"AWS::DynamoDB::Table":          {"TableName", 255, false},
	"AWS::SQS::Queue":               {"QueueName", 80, false},
	"AWS::SNS::Topic":               {"TopicName", 256, false},
	"AWS::CloudWatch::Alarm":        {"AlarmName", 255, false},
	"AWS::IAM::Role":                {"RoleName", 64, true},
	"AWS::IAM::ManagedPolicy":       {"ManagedPolicyName", 128, true},
}

// physicalName is a name the template sets explicitly: unnamed resources
// get unique generated names and cannot collide.
type physicalName struct {
	id    string // logical id (Function.Event for a SAM event)
	scope string // where the name must be unique
	tmpl  string // as written, ${...} unresolved
	max   int
}

// physicalNames lists every explicit name, including the schedules SAM
// generates for ScheduleV2 events: without Name (or OmitName: true) SAM
// names one <FunctionId><EventName>, the same in every stack.
func physicalNames(t *testing.T, raw map[string]any) []physicalName {
	t.Helper()
	var out []physicalName
	for _, id := range sortedKeys(at(t, raw, "Resources").(map[string]any)) {
		res := at(t, raw, "Resources", id).(map[string]any)
		typ, _ := res["Type"].(string)
		p := props(res)
		if lim, ok := nameLimits[typ]; ok {
			if name, ok := p[lim.prop].(string); ok {
				scope := typ
				if !lim.global {
					scope += " in the account and region"
				}
				if typ == "AWS::Serverless::Function" {
					scope = "AWS::Lambda::Function in the account and region"
				}
				if typ == "AWS::Scheduler::Schedule" {
					scope = "schedule in group " + groupOf(p)
				}
				out = append(out, physicalName{id, scope, name, lim.max})
			} else if _, set := p[lim.prop]; set {
				t.Errorf("%s.%s = %v: write names as strings or !Sub", id, lim.prop, p[lim.prop])
			}
		}
		events, _ := p["Events"].(map[string]any)
		for _, ev := range sortedKeys(events) {
			if at(t, events, ev, "Type") != "ScheduleV2" {
				continue
			}
			ep, _ := at(t, events, ev, "Properties").(map[string]any)
			if ep["OmitName"] == true {
				continue
			}
			name, ok := ep["Name"].(string)
			if !ok {
				name = id + ev
			}
			out = append(out, physicalName{id + "." + ev, "schedule in group " + groupOf(ep), name, 64})
		}
	}
	return out
}

// groupOf is the schedule group a schedule (or ScheduleV2 event) is in.
func groupOf(p map[string]any) string {
	if g, ok := p["GroupName"].(string); ok {
		return g
	}
	return "default"
}

// render resolves a name for one stack; anything else a name depends on is
// the same in every stack and cannot tell two stacks apart.
func render(t *testing.T, n physicalName, stack, tablePrefix string) string {
	t.Helper()
	s := strings.NewReplacer("${AWS::StackName}", stack, "${TablePrefix}", tablePrefix).Replace(n.tmpl)
	if strings.Contains(s, "${") {
		t.Errorf("%s: name %q depends on something besides the stack name and TablePrefix", n.id, n.tmpl)
	}
	return s
}

// TestTwoStacks: a second stack (staging beside prod) in the same account
// and region, with its own TablePrefix, creates no name the first one
// holds, and no stack names two resources alike.
func TestTwoStacks(t *testing.T) {
	raw := loadRaw(t)
	names := physicalNames(t, raw)
	if len(names) == 0 {
		t.Fatal("no explicit names found")
	}
	holder := map[string]string{}
	for _, stack := range []struct{ name, prefix string }{
		{"relay", "relay"},
		{"relay-staging", "relay-staging"},
	} {
		for _, n := range names {
			key := n.scope + ": " + render(t, n, stack.name, stack.prefix)
			who := fmt.Sprintf("%s of stack %s", n.id, stack.name)
			if prev, dup := holder[key]; dup {
				t.Errorf("%s collides with %s (%s)", who, prev, key)
			}
			holder[key] = who
		}
	}
}

// TestStackNameLimit derives the longest stack name from the names built
// from it and the services' limits, checks that docs say it, and that the
// resource with the binding name is created before anything the stack
// retains: CloudFormation cannot measure a string, so a too-long name can
// only fail at that resource, and a table created before the failure would
// outlive the rollback and block the next attempt.
func TestStackNameLimit(t *testing.T) {
	raw := loadRaw(t)
	prefix, _ := at(t, raw, "Parameters", "TablePrefix", "Default").(string)
	longest, binding := 128, "" // CloudFormation's own limit
	for _, n := range physicalNames(t, raw) {
		uses := strings.Count(n.tmpl, "${AWS::StackName}")
		if uses == 0 {
			continue
		}
		fit := (n.max - len(render(t, n, "", prefix))) / uses
		if fit < longest {
			longest, binding = fit, n.id
		}
	}
	if longest != maxStackName {
		t.Fatalf("longest stack name = %d (bound by %s), docs say %d", longest, binding, maxStackName)
	}
	for _, n := range physicalNames(t, raw) {
		if got := render(t, n, strings.Repeat("s", maxStackName), prefix); len(got) > n.max {
			t.Errorf("%s: %q is %d characters, over %d", n.id, got, len(got), n.max)
		}
	}
	if _, ok := at(t, raw, "Resources").(map[string]any)[binding]; !ok {
		t.Fatalf("the stack name is bound by %s, which is not a resource of the template (a SAM event): nothing can depend on it", binding)
	}
	for id, r := range at(t, raw, "Resources").(map[string]any) {
		res := r.(map[string]any)
		if res["DeletionPolicy"] != "Retain" && res["UpdateReplacePolicy"] != "Retain" {
			continue
		}
		var deps []string
		if d, ok := res["DependsOn"]; ok {
			deps = strs(t, d)
		}
		if !slices.Contains(deps, binding) {
			t.Errorf("%s is retained but does not DependsOn %s, whose name bounds the stack name", id, binding)
		}
	}
	limit := regexp.MustCompile(`(?i)stack name[^.]{0,40}?at most (\d+) characters|at most (\d+) characters[^.]{0,20}stack`)
	for _, doc := range []string{"README.md", "docs/deploy.md"} {
		text := readDoc(t, doc)
		found := limit.FindAllStringSubmatch(text, -1)
		if len(found) == 0 {
			t.Errorf("%s does not state the stack name limit (\"stack name ... at most %d characters\")", doc, maxStackName)
		}
		for _, m := range found {
			if n := m[1] + m[2]; n != fmt.Sprint(maxStackName) {
				t.Errorf("%s: %q, want %d", doc, m[0], maxStackName)
			}
		}
	}
}
