package deploy

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/lambda/env"
	"github.com/relay-dev/relay/lambda/fire"
)

// functionDirs maps each SAM function to the Go package its build target
// compiles (functions/<name>: one main package per function).
var functionDirs = map[string]string{
	"FireFunction":  "functions/fire",
	"SweepFunction": "functions/sweep",
	"ApiFunction":   "functions/api",
	// The operator API: the same package, serving other routes
	// (RELAY_API_ROUTES) under its own URL and role.
	"OpsFunction": "functions/api",
}

const (
	fireFunctionID = "FireFunction"
	// arnPrefix starts the fire function's ARN as the template spells it:
	// built from FunctionName because a GetAtt would be circular (see
	// template).
	arnPrefix = "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}:function:"
)

func TestFunctionsMatchDesign(t *testing.T) {
	fns := resources(t, loadRaw(t), "AWS::Serverless::Function")
	got := sortedKeys(fns)
	want := sortedKeys(functionDirs)
	if !slices.Equal(got, want) {
		t.Fatalf("functions = %v, want %v", got, want)
	}
	for id, fn := range fns {
		t.Run(id, func(t *testing.T) {
			uri, ok := props(fn)["CodeUri"].(string)
			if !ok {
				t.Fatalf("CodeUri %v is not a local path", props(fn)["CodeUri"])
			}
			if st, err := os.Stat(filepath.Join(repoRoot, uri)); err != nil || !st.IsDir() {
				t.Errorf("CodeUri %q is not a directory: %v", uri, err)
			}
			if _, err := os.Stat(filepath.Join(repoRoot, uri, "go.mod")); err != nil {
				t.Errorf("CodeUri %q must be the module root so `sam build` copies go.mod: %v", uri, err)
			}
			if bm := at(t, fn, "Metadata", "BuildMethod"); bm != "makefile" {
				t.Errorf("Metadata.BuildMethod = %v, want makefile", bm)
			}
		})
	}
}

// TestBuildTargets runs make the way `sam build` does and checks each
// function's recipe: static linux/arm64 binary named bootstrap in
// ARTIFACTS_DIR, built from the function's own package.
func TestBuildTargets(t *testing.T) {
	makePath, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed; sam build needs it too")
	}
	for id, dir := range functionDirs {
		t.Run(id, func(t *testing.T) {
			artifacts := t.TempDir()
			cmd := exec.Command(makePath, "--no-print-directory", "-n", "build-"+id, "ARTIFACTS_DIR="+artifacts)
			cmd.Dir = repoRoot
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("make -n build-%s: %v\n%s", id, err, out)
			}
			recipe := string(out)
			for _, want := range []string{
				"GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0", "go build", "-tags lambda.norpc",
				"-o " + artifacts + "/bootstrap", "./" + dir,
			} {
				if !strings.Contains(recipe, want) {
					t.Errorf("recipe of build-%s lacks %q:\n%s", id, want, recipe)
				}
			}
			for other, otherDir := range functionDirs {
				// Functions that share a package (api and ops) may share it.
				if other != id && otherDir != dir && strings.Contains(recipe, "./"+otherDir) {
					t.Errorf("build-%s builds %s's package", id, other)
				}
			}
			t.Run("package", func(t *testing.T) {
				main := filepath.Join(repoRoot, dir, "main.go")
				if _, err := os.Stat(main); err != nil {
					t.Fatalf("%s/main.go: %v (every function in the template needs its main package)", dir, err)
				}
				f, err := parser.ParseFile(token.NewFileSet(), main, nil, parser.PackageClauseOnly)
				if err != nil {
					t.Fatal(err)
				}
				if f.Name.Name != "main" {
					t.Errorf("%s is package %s, want main", main, f.Name.Name)
				}
			})
		})
	}
}

func TestGlobals(t *testing.T) {
	raw := loadRaw(t)
	fn := at(t, raw, "Globals", "Function")
	for key, want := range map[string]any{
		"Runtime": "provided.al2023",
		"Handler": "bootstrap",
	} {
		if got := at(t, fn, key); got != want {
			t.Errorf("Globals.Function.%s = %v, want %v", key, got, want)
		}
	}
	if got := strs(t, at(t, fn, "Architectures")); !slices.Equal(got, []string{"arm64"}) {
		t.Errorf("Architectures = %v, want [arm64]", got)
	}
	if got := at(t, fn, "LoggingConfig", "LogFormat"); got != "JSON" {
		t.Errorf("LogFormat = %v, want JSON", got)
	}
	if _, ok := at(t, fn, "Timeout").(int); !ok {
		t.Error("Globals.Function.Timeout is not a number")
	}
	vars := at(t, fn, "Environment", "Variables").(map[string]any)
	for _, name := range []string{"PLAN", "LOG_LEVEL", "SOURCE_TABLE", "TARGET_TABLE", "SCHEDULE_GROUP", "SCHEDULER_ROLE_ARN", "FIRE_FUNCTION_ARN", "METRICS_NAMESPACE", "METRICS_STACK", "METRICS_PER_SOURCE"} {
		if _, ok := vars[name]; !ok {
			t.Errorf("Globals environment lacks %s", name)
		}
	}
	if got, want := vars["SOURCE_TABLE"], "${SourceTable}"; got != want {
		t.Errorf("SOURCE_TABLE = %v, want %v", got, want)
	}
	if got, want := vars["TARGET_TABLE"], "${TargetTable}"; got != want {
		t.Errorf("TARGET_TABLE = %v, want %v", got, want)
	}
	if got, want := vars["FIRE_FUNCTION_ARN"], fireARN(t); got != want {
		t.Errorf("FIRE_FUNCTION_ARN = %v, want the fire function's ARN %v", got, want)
	}
}

// fireARN is the fire function's ARN built from its FunctionName.
func fireARN(t *testing.T) string {
	t.Helper()
	name, _ := props(at(t, loadRaw(t), "Resources", fireFunctionID).(map[string]any))["FunctionName"].(string)
	if name == "" {
		t.Fatal("FireFunction needs an explicit FunctionName: the scheduler role and FIRE_FUNCTION_ARN are built from it")
	}
	return arnPrefix + name
}

func TestPlanParameter(t *testing.T) {
	raw := loadRaw(t)
	p := at(t, raw, "Parameters", "Plan")
	got := strs(t, at(t, p, "AllowedValues"))
	if !slices.Equal(got, []string{"Free", "Paid"}) {
		t.Errorf("Plan AllowedValues = %v, want exactly [Free Paid]", got)
	}
	if d := at(t, p, "Default"); d != "Free" {
		t.Errorf("Plan default = %v, want Free", d)
	}
	// Every allowed value maps to the engine's plan name.
	for _, v := range got {
		if name := at(t, raw, "Mappings", "Plans", v, "Name"); name != strings.ToLower(v) {
			t.Errorf("Mappings.Plans.%s.Name = %v, want %s", v, name, strings.ToLower(v))
		}
	}
	params := at(t, raw, "Parameters").(map[string]any)
	for _, name := range []string{"TablePrefix", "LogLevel"} {
		if _, ok := params[name]; !ok {
			t.Errorf("no %s parameter", name)
		}
	}
}

// TestContinuationHopsParameter: the parameter's range is the fire
// handler's (lambda/fire), its default is the handler's default, and only
// the fire function receives it.
func TestContinuationHopsParameter(t *testing.T) {
	raw := loadRaw(t)
	p := at(t, raw, "Parameters", "ContinuationHops")
	for key, want := range map[string]int{"Default": fire.DefaultMaxHops, "MinValue": 0, "MaxValue": fire.MaxContinuationHops} {
		if got, ok := at(t, p, key).(int); !ok || got != want {
			t.Errorf("ContinuationHops.%s = %v, want %d", key, at(t, p, key), want)
		}
	}
	if typ := at(t, p, "Type"); typ != "Number" {
		t.Errorf("ContinuationHops.Type = %v, want Number", typ)
	}
	for id := range functionDirs {
		props := at(t, raw, "Resources", id, "Properties").(map[string]any)
		var vars map[string]any
		if e, ok := props["Environment"].(map[string]any); ok {
			vars, _ = e["Variables"].(map[string]any)
		}
		got, has := vars["CONTINUATION_HOPS"]
		switch {
		case id == fireFunctionID && got != "${ContinuationHops}":
			t.Errorf("FireFunction CONTINUATION_HOPS = %v, want !Ref ContinuationHops", got)
		case id != fireFunctionID && has:
			t.Errorf("%s sets CONTINUATION_HOPS; only the fire function continues", id)
		}
	}
	if _, ok := at(t, raw, "Globals", "Function", "Environment", "Variables").(map[string]any)["CONTINUATION_HOPS"]; ok {
		t.Error("CONTINUATION_HOPS is in Globals; only the fire function continues")
	}
}

// TestDrainSliceParameter: DrainSlice's default is lambda/env's, its
// pattern admits exactly lambda/env's range in whole seconds, and only the
// fire function receives it.
func TestDrainSliceParameter(t *testing.T) {
	raw := loadRaw(t)
	p := at(t, raw, "Parameters", "DrainSlice")
	if got := at(t, p, "Default"); got != env.DefaultDrainSlice.String() {
		t.Errorf("DrainSlice.Default = %v, want %s", got, env.DefaultDrainSlice)
	}
	re := regexp.MustCompile(at(t, p, "AllowedPattern").(string))
	for s := 0; s <= 40; s++ {
		v := fmt.Sprintf("%ds", s)
		if want := time.Duration(s)*time.Second <= env.MaxDrainSlice; re.MatchString(v) != want {
			t.Errorf("DrainSlice pattern on %q: %v, want %v", v, !want, want)
		}
	}
	for _, v := range []string{"", "5", "05s", "5m", "-1s", "1.5s"} {
		if re.MatchString(v) {
			t.Errorf("DrainSlice pattern admits %q", v)
		}
	}
	for id := range functionDirs {
		got, has := functionVars(t, raw, id)["DRAIN_SLICE"]
		switch {
		case id == fireFunctionID && got != "${DrainSlice}":
			t.Errorf("FireFunction DRAIN_SLICE = %v, want !Ref DrainSlice", got)
		case id != fireFunctionID && has:
			t.Errorf("%s sets DRAIN_SLICE; only the fire function drains", id)
		}
	}
}

// functionVars returns the environment variables a function declares
// itself (not the Globals').
func functionVars(t *testing.T, raw map[string]any, id string) map[string]any {
	t.Helper()
	props := at(t, raw, "Resources", id, "Properties").(map[string]any)
	if e, ok := props["Environment"].(map[string]any); ok {
		vars, _ := e["Variables"].(map[string]any)
		return vars
	}
	return nil
}

// TestFastKickAndConcurrencyParameters: FastKick (true|false, default
// true, as lambda/env parses FAST_KICK) reaches the api function only,
// the one whose role may invoke the fire function; DeliverConcurrency's
// range and default are lambda/env's and it reaches the two functions
// that deliver, fire and sweep.
func TestFastKickAndConcurrencyParameters(t *testing.T) {
	raw := loadRaw(t)
	fk := at(t, raw, "Parameters", "FastKick")
	if at(t, fk, "Default") != "true" || !slices.Equal(strs(t, at(t, fk, "AllowedValues")), []string{"true", "false"}) {
		t.Errorf("FastKick parameter %v, want true|false defaulting to true", fk)
	}
	dc := at(t, raw, "Parameters", "DeliverConcurrency")
	for key, want := range map[string]int{"Default": env.DefaultDeliverConcurrency, "MinValue": 1, "MaxValue": env.MaxDeliverConcurrency} {
		if got, ok := at(t, dc, key).(int); !ok || got != want {
			t.Errorf("DeliverConcurrency.%s = %v, want %d", key, at(t, dc, key), want)
		}
	}
	global := at(t, raw, "Globals", "Function", "Environment", "Variables").(map[string]any)
	for _, v := range []string{"FAST_KICK", "DELIVER_CONCURRENCY"} {
		if _, ok := global[v]; ok {
			t.Errorf("%s is in Globals", v)
		}
	}
	for id := range functionDirs {
		vars := functionVars(t, raw, id)
		if got, want := vars["FAST_KICK"], map[bool]any{true: "${FastKick}"}[id == "ApiFunction"]; got != want {
			t.Errorf("%s FAST_KICK = %v, want %v", id, got, want)
		}
		delivers := id == fireFunctionID || id == "SweepFunction"
		if got, want := vars["DELIVER_CONCURRENCY"], map[bool]any{true: "${DeliverConcurrency}"}[delivers]; got != want {
			t.Errorf("%s DELIVER_CONCURRENCY = %v, want %v", id, got, want)
		}
	}
}

type keyAttr struct{ name, keyType, attrType string }

// tableKeys reads a key schema with each attribute's declared type.
func tableKeys(t *testing.T, table map[string]any, schema any) []keyAttr {
	t.Helper()
	types := map[string]string{}
	for _, d := range at(t, table, "Properties", "AttributeDefinitions").([]any) {
		types[at(t, d, "AttributeName").(string)] = at(t, d, "AttributeType").(string)
	}
	var out []keyAttr
	for _, k := range schema.([]any) {
		name := at(t, k, "AttributeName").(string)
		out = append(out, keyAttr{name, at(t, k, "KeyType").(string), types[name]})
	}
	return out
}

func TestTables(t *testing.T) {
	raw := loadRaw(t)
	primary := []keyAttr{{"p", "HASH", "S"}, {"k", "RANGE", "S"}}
	for _, id := range []string{"SourceTable", "TargetTable"} {
		t.Run(id, func(t *testing.T) {
			tbl := at(t, raw, "Resources", id).(map[string]any)
			if typ := tbl["Type"]; typ != "AWS::DynamoDB::Table" {
				t.Fatalf("Type = %v", typ)
			}
			p := props(tbl)
			if got := tableKeys(t, tbl, p["KeySchema"]); !slices.Equal(got, primary) {
				t.Errorf("keys = %v, want %v", got, primary)
			}
			if bm := p["BillingMode"]; bm != "PAY_PER_REQUEST" {
				t.Errorf("BillingMode = %v, want PAY_PER_REQUEST", bm)
			}
			if pitr := at(t, p, "PointInTimeRecoverySpecification", "PointInTimeRecoveryEnabled"); pitr != true {
				t.Error("point-in-time recovery is not enabled")
			}
			for _, policy := range []string{"DeletionPolicy", "UpdateReplacePolicy"} {
				if tbl[policy] != "Retain" {
					t.Errorf("%s = %v, want Retain: deleting or replacing the stack's table must not drop undelivered rows", policy, tbl[policy])
				}
			}
			gsis, _ := p["GlobalSecondaryIndexes"].([]any)
			wantGSI := id == "SourceTable"
			if got := len(gsis); (got == 1) != wantGSI || got > 1 {
				t.Fatalf("%d global secondary indexes", got)
			}
			if !wantGSI {
				return
			}
			gsi := gsis[0]
			if name := at(t, gsi, "IndexName"); name != "due" {
				t.Errorf("index name %v, want due", name)
			}
			wantDue := []keyAttr{{"ds", "HASH", "S"}, {"due", "RANGE", "N"}}
			if got := tableKeys(t, tbl, at(t, gsi, "KeySchema")); !slices.Equal(got, wantDue) {
				t.Errorf("due index keys = %v, want %v", got, wantDue)
			}
			if pt := at(t, gsi, "Projection", "ProjectionType"); pt != "KEYS_ONLY" {
				t.Errorf("due index projection = %v, want KEYS_ONLY", pt)
			}
		})
	}
	t.Run("docs", func(t *testing.T) {
		doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "dynamodb.md"))
		if err != nil {
			t.Fatalf("docs/dynamodb.md documents the tables the template creates: %v", err)
		}
		for _, name := range []string{"`p`", "`k`", "`ds`", "`due`"} {
			if !strings.Contains(string(doc), name) {
				t.Errorf("docs/dynamodb.md does not document attribute %s used by template.yaml", name)
			}
		}
	})
}

// TestAsyncFailuresGoToDLQ: fire and sweep are invoked asynchronously
// (Scheduler, continuations), so Lambda's own retry and event age apply to
// them; each states its retries and sends what fails to the one
// dead-letter queue, which an alarm watches.
func TestAsyncFailuresGoToDLQ(t *testing.T) {
	raw := loadRaw(t)
	for id, wantRetries := range map[string]int{
		fireFunctionID: 2,
		// The next sweep is a minute away and covers the same alarms.
		"SweepFunction": 0,
	} {
		t.Run(id, func(t *testing.T) {
			cfg := at(t, raw, "Resources", id, "Properties", "EventInvokeConfig")
			if retries, ok := at(t, cfg, "MaximumRetryAttempts").(int); !ok || retries != wantRetries {
				t.Errorf("MaximumRetryAttempts = %v, want %d", at(t, cfg, "MaximumRetryAttempts"), wantRetries)
			}
			if age, ok := at(t, cfg, "MaximumEventAgeInSeconds").(int); !ok || age < 60 || age > 3600 {
				t.Errorf("MaximumEventAgeInSeconds = %v, want 60..3600", at(t, cfg, "MaximumEventAgeInSeconds"))
			}
			if typ := at(t, cfg, "DestinationConfig", "OnFailure", "Type"); typ != "SQS" {
				t.Errorf("OnFailure.Type = %v, want SQS", typ)
			}
			if dest := at(t, cfg, "DestinationConfig", "OnFailure", "Destination"); dest != "${DeadLetterQueue.Arn}" {
				t.Errorf("OnFailure.Destination = %v, want !GetAtt DeadLetterQueue.Arn", dest)
			}
		})
	}
	if typ := at(t, raw, "Resources", "DeadLetterQueue", "Type"); typ != "AWS::SQS::Queue" {
		t.Errorf("DeadLetterQueue is a %v", typ)
	}
	// The sweep's schedule must not retry either: Scheduler's retries would
	// come on top of Lambda's.
	for name, ev := range at(t, raw, "Resources", "SweepFunction", "Properties", "Events").(map[string]any) {
		if n := at(t, ev, "Properties", "RetryPolicy", "MaximumRetryAttempts"); n != 0 {
			t.Errorf("sweep schedule %s RetryPolicy.MaximumRetryAttempts = %v, want 0", name, n)
		}
	}
}

// TestDeadLetterAlarm: a message in the dead-letter queue is an invocation
// that failed for good; an alarm says so, notifying AlarmTopicArn when one
// is given and nothing otherwise.
func TestDeadLetterAlarm(t *testing.T) {
	raw := loadRaw(t)
	var watching []string
	for id, a := range resources(t, raw, "AWS::CloudWatch::Alarm") {
		p := props(a)
		dims, _ := p["Dimensions"].([]any)
		if p["Namespace"] != "AWS/SQS" || len(dims) != 1 || at(t, dims[0], "Value") != "${DeadLetterQueue.QueueName}" {
			continue
		}
		watching = append(watching, id)
		for key, want := range map[string]any{
			"MetricName":         "ApproximateNumberOfMessagesVisible",
			"ComparisonOperator": "GreaterThanThreshold",
			"Threshold":          0,
			"TreatMissingData":   "notBreaching",
		} {
			if got := p[key]; got != want {
				t.Errorf("%s.%s = %v, want %v", id, key, got, want)
			}
		}
		if d := at(t, dims[0], "Name"); d != "QueueName" {
			t.Errorf("%s dimension %v, want QueueName", id, d)
		}
		for _, key := range []string{"AlarmActions", "OKActions"} {
			want := map[string]any{"Fn::If": []any{"NotifyAlarmTopic", []any{"${AlarmTopicArn}"}, "${AWS::NoValue}"}}
			if got := p[key]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s.%s = %v, want !If [NotifyAlarmTopic, [!Ref AlarmTopicArn], !Ref AWS::NoValue]", id, key, got)
			}
		}
	}
	if len(watching) != 1 {
		t.Fatalf("alarms on the dead-letter queue: %v, want one", watching)
	}
	if cond := at(t, raw, "Conditions", "NotifyAlarmTopic"); fmt.Sprint(cond) != fmt.Sprint(map[string]any{"Fn::Not": []any{map[string]any{"Fn::Equals": []any{"${AlarmTopicArn}", ""}}}}) {
		t.Errorf("Conditions.NotifyAlarmTopic = %v, want AlarmTopicArn not empty", cond)
	}
	if d := at(t, raw, "Parameters", "AlarmTopicArn", "Default"); d != "" {
		t.Errorf("AlarmTopicArn default = %q, want empty (no notifications)", d)
	}
}

// TestLogGroups: every function logs to a group the stack owns, with the
// retention parameter, deleted with the stack; Lambda would otherwise
// create groups that never expire and outlive the stack.
func TestLogGroups(t *testing.T) {
	raw := loadRaw(t)
	groups := resources(t, raw, "AWS::Logs::LogGroup")
	used := map[string]string{}
	for id := range functionDirs {
		ref, _ := at(t, raw, "Resources", id, "Properties").(map[string]any)["LoggingConfig"].(map[string]any)["LogGroup"].(string)
		group, ok := strings.CutPrefix(ref, "${")
		group, _ = strings.CutSuffix(group, "}")
		if !ok || groups[group] == nil {
			t.Errorf("%s LoggingConfig.LogGroup = %q, want !Ref to a log group of the stack", id, ref)
			continue
		}
		if other, dup := used[group]; dup {
			t.Errorf("%s and %s share log group %s", id, other, group)
		}
		used[group] = id
	}
	for id, g := range groups {
		if used[id] == "" {
			t.Errorf("log group %s is used by no function", id)
		}
		if r := props(g)["RetentionInDays"]; r != "${LogRetentionDays}" {
			t.Errorf("%s RetentionInDays = %v, want !Ref LogRetentionDays", id, r)
		}
		for _, policy := range []string{"DeletionPolicy", "UpdateReplacePolicy"} {
			if g[policy] != "Delete" {
				t.Errorf("%s %s = %v, want Delete", id, policy, g[policy])
			}
		}
	}
	allowed := at(t, raw, "Parameters", "LogRetentionDays", "AllowedValues").([]any)
	if d := at(t, raw, "Parameters", "LogRetentionDays", "Default"); !slices.Contains(allowed, d) {
		t.Errorf("LogRetentionDays default %v not among its allowed values", d)
	}
}

// TestSystemLogLevel: Lambda's platform records (start, report with
// memory, init duration and timeouts) are kept on purpose; docs/deploy.md
// says why and what they cost.
func TestSystemLogLevel(t *testing.T) {
	raw := loadRaw(t)
	if got := at(t, raw, "Globals", "Function", "LoggingConfig", "SystemLogLevel"); got != "INFO" {
		t.Errorf("SystemLogLevel = %v, want INFO (WARN hides platform.report)", got)
	}
	doc := readDoc(t, "docs/deploy.md")
	if !strings.Contains(doc, "`SystemLogLevel: INFO`") {
		t.Error("docs/deploy.md does not document the SystemLogLevel decision")
	}
}

// TestFireConcurrency: the self-invoking fire function has reserved
// concurrency from a parameter, where 0 means no reservation (Lambda's own
// 0 would throttle every invocation, stopping delivery).
func TestFireConcurrency(t *testing.T) {
	raw := loadRaw(t)
	p := at(t, raw, "Parameters", "FireConcurrency")
	if d, ok := at(t, p, "Default").(int); !ok || d < 1 {
		t.Errorf("FireConcurrency default = %v, want a reservation (>= 1)", at(t, p, "Default"))
	}
	if m := at(t, p, "MinValue"); m != 0 {
		t.Errorf("FireConcurrency MinValue = %v, want 0 (no reservation)", m)
	}
	want := map[string]any{"Fn::If": []any{"ReserveFireConcurrency", "${FireConcurrency}", "${AWS::NoValue}"}}
	if got := at(t, raw, "Resources", fireFunctionID, "Properties", "ReservedConcurrentExecutions"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("FireFunction ReservedConcurrentExecutions = %v, want !If [ReserveFireConcurrency, !Ref FireConcurrency, !Ref AWS::NoValue]", got)
	}
	if cond := at(t, raw, "Conditions", "ReserveFireConcurrency"); fmt.Sprint(cond) != fmt.Sprint(map[string]any{"Fn::Not": []any{map[string]any{"Fn::Equals": []any{"${FireConcurrency}", 0}}}}) {
		t.Errorf("Conditions.ReserveFireConcurrency = %v, want FireConcurrency != 0", cond)
	}
	for id := range functionDirs {
		if _, ok := at(t, raw, "Resources", id, "Properties").(map[string]any)["ReservedConcurrentExecutions"]; ok && id != fireFunctionID {
			t.Errorf("%s reserves concurrency; only the self-invoking fire function needs a bound", id)
		}
	}
}

func TestSweepRunsEveryMinute(t *testing.T) {
	raw := loadRaw(t)
	events := at(t, raw, "Resources", "SweepFunction", "Properties", "Events").(map[string]any)
	found := 0
	for name := range events {
		if at(t, events, name, "Type") != "ScheduleV2" {
			continue
		}
		found++
		if expr := at(t, events, name, "Properties", "ScheduleExpression"); expr != "rate(1 minute)" {
			t.Errorf("sweep schedule %s = %v, want rate(1 minute): it bounds lag by RELAY_LAG_BOUND_MS", name, expr)
		}
	}
	if found != 1 {
		t.Errorf("SweepFunction has %d ScheduleV2 events, want 1", found)
	}
}

func TestApiFunctionURLUsesIAM(t *testing.T) {
	for _, id := range []string{"ApiFunction", "OpsFunction"} {
		if auth := at(t, loadRaw(t), "Resources", id, "Properties", "FunctionUrlConfig", "AuthType"); auth != "AWS_IAM" {
			t.Errorf("%s FunctionUrlConfig.AuthType = %v, want AWS_IAM", id, auth)
		}
	}
}

func TestOutputs(t *testing.T) {
	outputs := at(t, loadRaw(t), "Outputs").(map[string]any)
	for _, name := range []string{
		"FireFunctionArn", "SweepFunctionArn", "ApiFunctionArn", "ApiUrl",
		"SourceTableName", "TargetTableName", "DeadLetterQueueUrl", "DeadLetterAlarmName",
		"OpsFunctionArn", "OpsUrl", "OldestUndeliveredAlarmName", "QuarantineAlarmName", "SweepErrorAlarmName",
	} {
		if _, ok := outputs[name]; !ok {
			t.Errorf("no output %s", name)
		}
	}
}

func TestScheduleGroup(t *testing.T) {
	raw := loadRaw(t)
	groups := resources(t, raw, "AWS::Scheduler::ScheduleGroup")
	if len(groups) != 1 {
		t.Fatalf("%d schedule groups, want 1 dedicated group", len(groups))
	}
	for id, g := range groups {
		name, ok := props(g)["Name"].(string)
		if !ok {
			t.Fatalf("%s has no Name: the scheduler role's SourceArn condition names it", id)
		}
		src := at(t, schedulerRole(t, raw), "Properties", "AssumeRolePolicyDocument", "Statement", 0, "Condition", "ArnEquals", "aws:SourceArn")
		want := "arn:${AWS::Partition}:scheduler:${AWS::Region}:${AWS::AccountId}:schedule-group/" + name
		if src != want {
			t.Errorf("scheduler role SourceArn = %v, want %v", src, want)
		}
		if got := at(t, raw, "Globals", "Function", "Environment", "Variables", "SCHEDULE_GROUP"); got != renderRef(id) {
			t.Errorf("SCHEDULE_GROUP = %v, want %s", got, renderRef(id))
		}
	}
}

// TestReferencesResolve catches typos in ${...}: every reference names a
// parameter, a resource, a pseudo parameter or a resource SAM generates.
func TestReferencesResolve(t *testing.T) {
	raw := loadRaw(t)
	known := map[string]bool{
		"AWS::Partition": true, "AWS::Region": true, "AWS::AccountId": true, "AWS::StackName": true,
		"AWS::StackId": true, "AWS::URLSuffix": true, "AWS::NoValue": true,
		"ApiFunctionUrl": true, // SAM's AWS::Lambda::Url for FunctionUrlConfig
		"OpsFunctionUrl": true,
	}
	for name := range at(t, raw, "Parameters").(map[string]any) {
		known[name] = true
	}
	for name := range at(t, raw, "Resources").(map[string]any) {
		known[name] = true
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		case string:
			for rest := x; ; {
				i := strings.Index(rest, "${")
				if i < 0 {
					break
				}
				j := strings.Index(rest[i:], "}")
				if j < 0 {
					t.Errorf("%s: unterminated ${ in %q", path, x)
					break
				}
				ref, _, _ := strings.Cut(rest[i+2:i+j], ".")
				if !known[ref] {
					t.Errorf("%s: reference to unknown %q in %q", path, ref, x)
				}
				rest = rest[i+j:]
			}
		}
	}
	walk("", raw)
}
