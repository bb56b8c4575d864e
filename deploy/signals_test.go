package deploy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/relay-dev/relay/lambda/metrics"
	"github.com/relay-dev/relay/relaycore"
)

// notifyTopic is the action list every alarm uses: AlarmTopicArn when set.
var notifyTopic = map[string]any{"Fn::If": []any{"NotifyAlarmTopic", []any{"${AlarmTopicArn}"}, "${AWS::NoValue}"}}

// TestEveryAlarmNotifiesTopic: one optional SNS topic for all alarms, on
// ALARM and on OK.
func TestEveryAlarmNotifiesTopic(t *testing.T) {
	for id, a := range resources(t, loadRaw(t), "AWS::CloudWatch::Alarm") {
		for _, key := range []string{"AlarmActions", "OKActions"} {
			if got := props(a)[key]; fmt.Sprint(got) != fmt.Sprint(notifyTopic) {
				t.Errorf("%s.%s = %v, want !If [NotifyAlarmTopic, [!Ref AlarmTopicArn], !Ref AWS::NoValue]", id, key, got)
			}
		}
	}
}

// TestMetricAlarms: the alarms on the functions' EMF metrics watch metrics
// lambda/metrics writes, in the configured namespace, on the per-stack
// aggregate (the Stack dimension the functions get from METRICS_STACK),
// with the thresholds docs/operations.md explains.
func TestMetricAlarms(t *testing.T) {
	raw := loadRaw(t)
	vars := at(t, raw, "Globals", "Function", "Environment", "Variables").(map[string]any)
	for name, want := range map[string]string{
		"METRICS_NAMESPACE": "${MetricsNamespace}", "METRICS_STACK": "${AWS::StackName}", "METRICS_PER_SOURCE": "${MetricsPerSource}",
	} {
		if vars[name] != want {
			t.Errorf("Globals %s = %v, want %s", name, vars[name], want)
		}
	}
	want := map[string]struct {
		metric, stat, threshold, missing string
	}{
		"OldestUndeliveredAlarm": {metrics.OldestUndeliveredAge, "Maximum", "${OldestUndeliveredAlarmMs}", "ignore"},
		"QuarantineAlarm":        {metrics.TargetsQuarantined, "Maximum", "0", "notBreaching"},
		"SweepErrorAlarm":        {metrics.SweepErrors, "Sum", "0", "notBreaching"},
		"TakedownOverdueAlarm":   {metrics.TakedownHoldersOverdue, "Maximum", "0", "notBreaching"},
	}
	seen := map[string]bool{}
	for id, a := range resources(t, raw, "AWS::CloudWatch::Alarm") {
		p := props(a)
		if p["Namespace"] == "AWS/SQS" {
			continue // DeadLetterAlarm: TestDeadLetterAlarm
		}
		w, ok := want[id]
		if !ok {
			t.Errorf("unexpected alarm %s on %v", id, p["MetricName"])
			continue
		}
		seen[id] = true
		if p["Namespace"] != "${MetricsNamespace}" {
			t.Errorf("%s Namespace = %v, want !Ref MetricsNamespace", id, p["Namespace"])
		}
		if !slices.Contains(metrics.Names, fmt.Sprint(p["MetricName"])) || p["MetricName"] != w.metric {
			t.Errorf("%s MetricName = %v, want %s", id, p["MetricName"], w.metric)
		}
		dims, _ := p["Dimensions"].([]any)
		if len(dims) != 1 || at(t, dims[0], "Name") != metrics.DimStack || at(t, dims[0], "Value") != "${AWS::StackName}" {
			t.Errorf("%s Dimensions = %v, want exactly Stack = the stack name (the aggregate every line has)", id, dims)
		}
		for key, v := range map[string]string{"Statistic": w.stat, "Threshold": w.threshold, "TreatMissingData": w.missing, "ComparisonOperator": "GreaterThanThreshold"} {
			if fmt.Sprint(p[key]) != v {
				t.Errorf("%s %s = %v, want %s", id, key, p[key], v)
			}
		}
	}
	for id := range want {
		if !seen[id] {
			t.Errorf("no alarm %s", id)
		}
	}
	// "A few times" the lag bound the sweep keeps.
	d, ok := at(t, raw, "Parameters", "OldestUndeliveredAlarmMs", "Default").(int)
	if !ok || d < 2*relaycore.RelayLagBoundMS || d > 5*relaycore.RelayLagBoundMS {
		t.Errorf("OldestUndeliveredAlarmMs default %v, want 2..5 x RELAY_LAG_BOUND_MS (%d)", d, relaycore.RelayLagBoundMS)
	}
	if m, _ := at(t, raw, "Parameters", "OldestUndeliveredAlarmMs", "MinValue").(int); m < relaycore.RelayLagBoundMS {
		t.Errorf("OldestUndeliveredAlarmMs MinValue %d below the lag bound: the alarm would go off in normal operation", m)
	}
	if d := at(t, raw, "Parameters", "MetricsNamespace", "Default"); d != metrics.DefaultNamespace {
		t.Errorf("MetricsNamespace default %v, want %s", d, metrics.DefaultNamespace)
	}
	if got := strs(t, at(t, raw, "Parameters", "MetricsPerSource", "AllowedValues")); !slices.Equal(got, []string{"false", "true"}) {
		t.Errorf("MetricsPerSource AllowedValues %v, want [false true] (what METRICS_PER_SOURCE accepts)", got)
	}
}

// TestOperatorRoutesSeparate: producer and operator routes are served by
// two functions with their own URLs and roles, so an IAM grant on one
// URL does not reach the other's routes; neither role writes a target
// partition (both may read one) and the producer role cannot delete from
// the outbox.
func TestOperatorRoutesSeparate(t *testing.T) {
	raw := loadRaw(t)
	for id, routes := range map[string]string{"ApiFunction": "producer", "OpsFunction": "operator"} {
		p := at(t, raw, "Resources", id, "Properties").(map[string]any)
		if got := at(t, p, "Environment", "Variables", "RELAY_API_ROUTES"); got != routes {
			t.Errorf("%s RELAY_API_ROUTES = %v, want %s", id, got, routes)
		}
		if _, ok := p["Role"]; ok {
			t.Errorf("%s names a Role; each function gets its own (SAM's) role from its Policies", id)
		}
	}
	grants := map[string]map[string][]string{} // function -> action -> resources
	for _, s := range policyStatements(t, raw) {
		owner, _, _ := strings.Cut(s.where, "#")
		if grants[owner] == nil {
			grants[owner] = map[string][]string{}
		}
		for _, a := range s.actions {
			grants[owner][a] = append(grants[owner][a], s.resources...)
		}
	}
	ops, api := grants["OpsFunction"], grants["ApiFunction"]
	// Target reads (GET /v1/targets/..., a target's rh) are the only
	// access either function has to the target table: no write reaches it.
	targetRead := func(a string) bool { return a == "dynamodb:GetItem" || a == "dynamodb:Query" }
	for a, rs := range ops {
		if !targetRead(a) && slices.Contains(rs, "${TargetTable.Arn}") {
			t.Errorf("OpsFunction: %s on the target table; operators only read it (rh, target reads)", a)
		}
	}
	if !slices.Contains(ops["dynamodb:GetItem"], "${TargetTable.Arn}") || !slices.Contains(ops["dynamodb:DeleteItem"], "${SourceTable.Arn}") {
		t.Errorf("OpsFunction grants %v; it needs the target table's rh and source deletes (skip, retry markers)", ops)
	}
	if len(api["dynamodb:DeleteItem"]) != 0 {
		t.Errorf("ApiFunction may DeleteItem %v; producers only append", api["dynamodb:DeleteItem"])
	}
	for a, rs := range api {
		if a != "dynamodb:Query" && slices.Contains(rs, "${TargetTable.Arn}") {
			t.Errorf("ApiFunction: %s on the target table; producers only page through it (target reads)", a)
		}
	}
}

// TestCallerPolicyExamplesPerRole: docs/deploy.md shows one caller policy
// for producers (the api function) and one for operators (the ops
// function), each granting the two invoke actions on its own function
// only (TestCallerPolicyExample checks both actions are there).
func TestCallerPolicyExamplesPerRole(t *testing.T) {
	doc := readDoc(t, "docs/deploy.md")
	found := map[string]bool{}
	for _, block := range strings.Split(doc, "```json\n")[1:] {
		body, _, _ := strings.Cut(block, "```")
		if !strings.Contains(body, "lambda:Invoke") {
			continue
		}
		var policy struct{ Statement []map[string]any }
		if err := json.Unmarshal([]byte(body), &policy); err != nil {
			t.Fatalf("example policy is not JSON: %v\n%s", err, body)
		}
		var fns []string
		for _, s := range policy.Statement {
			for _, r := range strs(t, s["Resource"]) {
				switch {
				case strings.Contains(r, "-ApiFunction-"):
					fns = append(fns, "api")
				case strings.Contains(r, "-OpsFunction-"):
					fns = append(fns, "ops")
				default:
					t.Errorf("example policy resource %s names neither the api nor the ops function", r)
				}
			}
		}
		slices.Sort(fns)
		fns = slices.Compact(fns)
		if len(fns) != 1 {
			t.Errorf("example policy grants %v; each example is for one kind of caller", fns)
			continue
		}
		found[fns[0]] = true
	}
	if !found["api"] || !found["ops"] {
		t.Errorf("docs/deploy.md caller policies for %v, want a producer (api) and an operator (ops) example", found)
	}
}
