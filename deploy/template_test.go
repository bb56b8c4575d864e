package deploy

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/awslabs/goformation/v7/cloudformation/dynamodb"

	"github.com/relay-dev/relay/lambda/fire"
)

// functionDirs maps each SAM function to the Go package its build target
// compiles (functions/<name>, DESIGN.md §2).
var functionDirs = map[string]string{
	"FireFunction":  "functions/fire",
	"SweepFunction": "functions/sweep",
	"ApiFunction":   "functions/api",
}

const (
	fireFunctionID = "FireFunction"
	// fireARN is the fire function's ARN as the template spells it: built
	// from FunctionName because a GetAtt would be circular (see template).
	arnPrefix = "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}:function:"
)

func TestFunctionsMatchDesign(t *testing.T) {
	tmpl := loadTemplate(t)
	fns := tmpl.GetAllServerlessFunctionResources()
	var got []string
	for id := range fns {
		got = append(got, id)
	}
	sort.Strings(got)
	want := []string{"ApiFunction", "FireFunction", "SweepFunction"}
	if !slices.Equal(got, want) {
		t.Fatalf("functions = %v, want %v", got, want)
	}
	for id, fn := range fns {
		t.Run(id, func(t *testing.T) {
			if fn.CodeUri == nil || fn.CodeUri.String == nil {
				t.Fatal("CodeUri is not a local path")
			}
			if st, err := os.Stat(filepath.Join(repoRoot, *fn.CodeUri.String)); err != nil || !st.IsDir() {
				t.Errorf("CodeUri %q is not a directory: %v", *fn.CodeUri.String, err)
			}
			if _, err := os.Stat(filepath.Join(repoRoot, *fn.CodeUri.String, "go.mod")); err != nil {
				t.Errorf("CodeUri %q must be the module root so `sam build` copies go.mod: %v", *fn.CodeUri.String, err)
			}
			if bm := fn.AWSCloudFormationMetadata["BuildMethod"]; bm != "makefile" {
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
				if other != id && strings.Contains(recipe, "./"+otherDir) {
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
	for _, name := range []string{"PLAN", "LOG_LEVEL", "SOURCE_TABLE", "TARGET_TABLE", "SCHEDULE_GROUP", "SCHEDULER_ROLE_ARN", "FIRE_FUNCTION_ARN"} {
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
	fn, err := loadTemplate(t).GetServerlessFunctionWithName(fireFunctionID)
	if err != nil {
		t.Fatal(err)
	}
	if fn.FunctionName == nil || *fn.FunctionName == "" {
		t.Fatal("FireFunction needs an explicit FunctionName: the scheduler role and FIRE_FUNCTION_ARN are built from it")
	}
	return arnPrefix + *fn.FunctionName
}

func TestPlanParameter(t *testing.T) {
	tmpl := loadTemplate(t)
	p, ok := tmpl.Parameters["Plan"]
	if !ok {
		t.Fatal("no Plan parameter")
	}
	var got []string
	for _, v := range p.AllowedValues {
		s, _ := v.(string)
		got = append(got, s)
	}
	if !slices.Equal(got, []string{"Free", "Paid"}) {
		t.Errorf("Plan AllowedValues = %v, want exactly [Free Paid]", got)
	}
	if p.Default != "Free" {
		t.Errorf("Plan default = %v, want Free", p.Default)
	}
	// Every allowed value maps to the engine's plan name.
	raw := loadRaw(t)
	for _, v := range got {
		if name := at(t, raw, "Mappings", "Plans", v, "Name"); name != strings.ToLower(v) {
			t.Errorf("Mappings.Plans.%s.Name = %v, want %s", v, name, strings.ToLower(v))
		}
	}
	for _, name := range []string{"TablePrefix", "LogLevel"} {
		if _, ok := tmpl.Parameters[name]; !ok {
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

type keyAttr struct{ name, keyType, attrType string }

func tableKeys(t *testing.T, tbl *dynamodb.Table, schema []dynamodb.Table_KeySchema) []keyAttr {
	t.Helper()
	types := map[string]string{}
	for _, d := range tbl.AttributeDefinitions {
		types[d.AttributeName] = d.AttributeType
	}
	var out []keyAttr
	for _, k := range schema {
		out = append(out, keyAttr{k.AttributeName, k.KeyType, types[k.AttributeName]})
	}
	return out
}

func TestTables(t *testing.T) {
	tmpl := loadTemplate(t)
	primary := []keyAttr{{"p", "HASH", "S"}, {"k", "RANGE", "S"}}
	for _, id := range []string{"SourceTable", "TargetTable"} {
		t.Run(id, func(t *testing.T) {
			tbl, err := tmpl.GetDynamoDBTableWithName(id)
			if err != nil {
				t.Fatal(err)
			}
			if got := tableKeys(t, tbl, tbl.KeySchema); !slices.Equal(got, primary) {
				t.Errorf("keys = %v, want %v", got, primary)
			}
			if tbl.BillingMode == nil || *tbl.BillingMode != "PAY_PER_REQUEST" {
				t.Errorf("BillingMode = %v, want PAY_PER_REQUEST", tbl.BillingMode)
			}
			if pitr := tbl.PointInTimeRecoverySpecification; pitr == nil || pitr.PointInTimeRecoveryEnabled == nil || !*pitr.PointInTimeRecoveryEnabled {
				t.Error("point-in-time recovery is not enabled")
			}
			if tbl.AWSCloudFormationDeletionPolicy != "Retain" {
				t.Errorf("DeletionPolicy = %q, want Retain: deleting the stack must not drop undelivered rows", tbl.AWSCloudFormationDeletionPolicy)
			}
			wantGSI := id == "SourceTable"
			if got := len(tbl.GlobalSecondaryIndexes); (got == 1) != wantGSI || got > 1 {
				t.Fatalf("%d global secondary indexes", got)
			}
			if !wantGSI {
				return
			}
			gsi := tbl.GlobalSecondaryIndexes[0]
			if gsi.IndexName != "due" {
				t.Errorf("index name %q, want due", gsi.IndexName)
			}
			wantDue := []keyAttr{{"ds", "HASH", "S"}, {"due", "RANGE", "N"}}
			if got := tableKeys(t, tbl, gsi.KeySchema); !slices.Equal(got, wantDue) {
				t.Errorf("due index keys = %v, want %v", got, wantDue)
			}
			if pt := gsi.Projection.ProjectionType; pt == nil || *pt != "KEYS_ONLY" {
				t.Errorf("due index projection = %v, want KEYS_ONLY", derefOr(pt, "unset"))
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

func TestFireFunctionAsyncFailuresGoToDLQ(t *testing.T) {
	raw := loadRaw(t)
	cfg := at(t, raw, "Resources", fireFunctionID, "Properties", "EventInvokeConfig")
	retries, ok := at(t, cfg, "MaximumRetryAttempts").(int)
	if !ok || retries < 0 || retries > 2 {
		t.Errorf("MaximumRetryAttempts = %v, want 0..2", at(t, cfg, "MaximumRetryAttempts"))
	}
	if typ := at(t, cfg, "DestinationConfig", "OnFailure", "Type"); typ != "SQS" {
		t.Errorf("OnFailure.Type = %v, want SQS", typ)
	}
	dest, _ := at(t, cfg, "DestinationConfig", "OnFailure", "Destination").(string)
	queue, ok := strings.CutSuffix(strings.TrimPrefix(dest, "${"), ".Arn}")
	if !ok {
		t.Fatalf("OnFailure.Destination = %q, want !GetAtt <queue>.Arn", dest)
	}
	if typ := at(t, raw, "Resources", queue, "Type"); typ != "AWS::SQS::Queue" {
		t.Errorf("DLQ %s is a %v", queue, typ)
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
	fn, err := loadTemplate(t).GetServerlessFunctionWithName("ApiFunction")
	if err != nil {
		t.Fatal(err)
	}
	if fn.FunctionUrlConfig == nil || fn.FunctionUrlConfig.AuthType != "AWS_IAM" {
		t.Errorf("ApiFunction FunctionUrlConfig = %+v, want AuthType AWS_IAM", fn.FunctionUrlConfig)
	}
}

func TestOutputs(t *testing.T) {
	tmpl := loadTemplate(t)
	for _, name := range []string{
		"FireFunctionArn", "SweepFunctionArn", "ApiFunctionArn", "ApiUrl",
		"SourceTableName", "TargetTableName", "FireDeadLetterQueueUrl",
	} {
		if _, ok := tmpl.Outputs[name]; !ok {
			t.Errorf("no output %s", name)
		}
	}
}

func TestScheduleGroup(t *testing.T) {
	tmpl := loadTemplate(t)
	groups := tmpl.GetAllSchedulerScheduleGroupResources()
	if len(groups) != 1 {
		t.Fatalf("%d schedule groups, want 1 dedicated group", len(groups))
	}
	for id, g := range groups {
		if g.Name == nil {
			t.Fatalf("%s has no Name: the scheduler role's SourceArn condition names it", id)
		}
		raw := loadRaw(t)
		src := at(t, schedulerRole(t, raw), "Properties", "AssumeRolePolicyDocument", "Statement", 0, "Condition", "ArnEquals", "aws:SourceArn")
		want := "arn:${AWS::Partition}:scheduler:${AWS::Region}:${AWS::AccountId}:schedule-group/" + *g.Name
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
		"AWS::StackId": true, "AWS::URLSuffix": true,
		"ApiFunctionUrl": true, // SAM's AWS::Lambda::Url for FunctionUrlConfig
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

func derefOr(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}
