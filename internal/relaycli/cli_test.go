package relaycli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/internal/demo"
	"github.com/relay-dev/relay/relaycore"
)

func TestDemoJSON(t *testing.T) {
	var out, errb bytes.Buffer
	db := filepath.Join(t.TempDir(), "r.db")
	code := Run(context.Background(), []string{"demo", "--json", "--db", db, "--sources", "2", "--targets", "6",
		"--rows", "60", "--batch", "10", "--write-interval", "0", "--plan", "paid"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var sum struct {
		RowsEnqueued int64 `json:"rows_enqueued"`
		Verified     bool  `json:"verified"`
		Plan         string
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatalf("stdout is not the JSON summary: %v\n%s", err, out.String())
	}
	if !sum.Verified || sum.RowsEnqueued != 120 || sum.Plan != "paid" {
		t.Fatalf("summary %+v", sum)
	}
	// status reads the same file afterwards.
	out.Reset()
	if code := Run(context.Background(), []string{"status", "--db", db, "src-00"}, &out, &errb); code != 0 {
		t.Fatalf("status exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), `"Empty": true`) {
		t.Fatalf("status after drain: %s", out.String())
	}
}

func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--plan", "gold"},
		{"demo", "--store", "postgres"},
		{"demo", "--log-level", "loud"},
		{"demo", "--inject-throttle", "0.2"}, // needs --store dynamo
		{"demo", "--reuse-tables"},           // needs --store dynamo
		{"demo", "--store", "dynamo", "--db", "x.db"},
		{"demo", "--store", "dynamo", "--inject-throttle", "0.9", "--inject-drop", "0.2"}, // more than all requests
		{"demo", "--store", "dynamo", "--inject-drop", "-0.1"},
		{"status", "src"},
		{"nope"},
	} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), args, &out, &errb); code == 0 {
			t.Errorf("%v: exit 0, want failure", args)
		} else if errb.Len() == 0 {
			t.Errorf("%v: no error message", args)
		}
	}
	// A command asked for --json says what is wrong as JSON too; one
	// without it prints nothing on stdout.
	for _, args := range [][]string{
		{"demo", "--json", "--log-level", "loud"},
		{"demo", "--json", "--reuse-tables"},
		{"demo", "--json", "--nope"},
		{"targets", "list", "--json"},
		{"targets", "show", "--json", "--source", "orders", "--db", "x.db"},
	} {
		out, _ := cli(t, 1, "", args...)
		if e := jsonError(t, out); e.Code != codeUsage {
			t.Errorf("%v: %+v", args, e)
		}
	}
	if out, _ := cli(t, 1, "", "targets", "list"); out != "" {
		t.Errorf("a failure without --json printed on stdout: %q", out)
	}
	out, _ := cli(t, 1, "", "targets", "list", "--json", "--source", "orders", "--db", filepath.Join(t.TempDir(), "missing.db"))
	if e := jsonError(t, out); e.Code != codeFailed || !strings.Contains(e.Message, "missing.db") {
		t.Errorf("missing --db file: %+v", e)
	}
}

// The DynamoDB backend (real SDK over HTTP to an in-process endpoint) runs
// the same self-verifying workload.
func TestDemoOnDynamo(t *testing.T) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"demo", "--json", "--store", "dynamo", "--sources", "2", "--targets", "5",
		"--rows", "40", "--batch", "10", "--write-interval", "0"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var sum struct {
		Verified   bool    `json:"verified"`
		WriteUnits float64 `json:"write_units_per_row"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatal(err)
	}
	if !sum.Verified || sum.WriteUnits <= 0 {
		t.Fatalf("summary %s", out.String())
	}
}

// enqueue → status → fire → status on one bbolt file, as an operator would.
func TestEnqueueFireStatus(t *testing.T) {
	db := filepath.Join(t.TempDir(), "r.db")
	run := func(stdin string, args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := RunWithInput(context.Background(), args, strings.NewReader(stdin), &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	body := `{"rows":[{"target":"t1","puts":[{"key":"a","value":"aGVsbG8="}]},{"target":"t2","deletes":["b"]}]}`
	if out := run(body, "enqueue", "--db", db, "--source", "orders"); !strings.Contains(out, `"seqs":[1,2]`) {
		t.Fatalf("enqueue printed %s", out)
	}
	if out := run("", "status", "--db", db, "orders"); !strings.Contains(out, `"Empty": false`) {
		t.Fatalf("status before fire: %s", out)
	}
	if out := run("", "fire", "--db", db, "orders"); !strings.Contains(out, "2 rows delivered") || !strings.Contains(out, "outbox empty: true") {
		t.Fatalf("fire printed %s", out)
	}
	if out := run("", "status", "--db", db, "orders"); !strings.Contains(out, `"Empty": true`) {
		t.Fatalf("status after fire: %s", out)
	}
	// A bad body is refused and writes nothing.
	var out, errb bytes.Buffer
	if code := RunWithInput(context.Background(), []string{"enqueue", "--db", db, "--source", "orders"},
		strings.NewReader(`{"rows":[{"target":"t1","puts":[{"key":"a"}]}]}`), &out, &errb); code == 0 || !strings.Contains(errb.String(), "value is required") {
		t.Fatalf("bad body: exit %d, %s", code, errb.String())
	}
}

// Under the fault rates that used to end the run without a summary (a
// fifth of the requests throttled, one in twenty responses lost after the
// endpoint ran the request), the demo rides out what its store gives up
// on, verifies and says what was injected.
func TestDemoOnDynamoRidesOutFaults(t *testing.T) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"demo", "--json", "--store", "dynamo", "--sources", "2", "--targets", "5",
		"--rows", "60", "--batch", "10", "--write-interval", "0", "--inject-throttle", "0.2", "--inject-drop", "0.05"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errb.String(), out.String())
	}
	var sum struct {
		Verified  bool  `json:"verified"`
		Enqueued  int64 `json:"rows_enqueued"`
		Throttles int64 `json:"injected_throttles"`
		Drops     int64 `json:"injected_drops"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatal(err)
	}
	if !sum.Verified || sum.Enqueued != 120 || sum.Throttles == 0 || sum.Drops == 0 {
		t.Fatalf("summary %s", out.String())
	}
}

// Tables that already hold items are refused unless --reuse-tables says
// to run on them; the refusal writes nothing.
func TestDemoRefusesNonEmptyTables(t *testing.T) {
	ep := dynamotest.Start(t)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "relay")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "relay")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	client := ep.Client(nil)
	if err := dynamo.CreateTable(t.Context(), client, "mine-target"); err != nil {
		t.Fatal(err)
	}
	st := dynamo.New(client, "mine-target", dynamo.Options{})
	if err := st.Apply(t.Context(), "customer", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("precious")}}}); err != nil {
		t.Fatal(err)
	}
	args := []string{"demo", "--store", "dynamo", "--endpoint", ep.URL, "--table-prefix", "mine-", "--sources", "1",
		"--targets", "2", "--rows", "10", "--batch", "5", "--write-interval", "0", "--failing-target=false"}
	var out, errb bytes.Buffer
	if code := Run(t.Context(), args, &out, &errb); code == 0 || !strings.Contains(errb.String(), "mine-target already holds items") ||
		!strings.Contains(errb.String(), "--reuse-tables") {
		t.Fatalf("exit %d on a table with data: %s", code, errb.String())
	}
	src := dynamo.New(client, "mine-source", dynamo.Options{})
	if page, err := src.Scan(t.Context(), "src-00", relaycore.ScanRequest{}); err != nil || len(page.Items) != 0 {
		t.Fatalf("the refused run wrote to the source table: %v %v", page.Items, err)
	}
	out.Reset()
	errb.Reset()
	if code := Run(t.Context(), append(args, "--reuse-tables"), &out, &errb); code != 0 || !strings.Contains(out.String(), "verified           true") {
		t.Fatalf("--reuse-tables: exit %d: %s\n%s", code, errb.String(), out.String())
	}
	if v, ok, err := st.Get(t.Context(), "customer", "k"); err != nil || !ok || string(v) != "precious" {
		t.Fatalf("the item already there: %q %v %v", v, ok, err)
	}
}

// demo --help describes both stores, not only bbolt.
func TestDemoHelpDescribesEachStore(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"demo", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	help := out.String()
	for _, want := range []string{"bolt    a bbolt file", "dynamo  two DynamoDB tables", "--reuse-tables", "--inject-throttle"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
	if strings.Contains(help, "(bbolt store,") {
		t.Errorf("help still says the demo runs on bbolt whatever --store says:\n%s", help)
	}
}

// A failed run prints its summary, saying why it failed.
func TestSummarySaysWhyItFailed(t *testing.T) {
	var out bytes.Buffer
	printSummary(&out, demo.Summary{Store: "bolt:x", RowsEnqueued: 40, Error: "verify: tgt-001/k: missing"})
	if !strings.Contains(out.String(), "rows enqueued      40") || !strings.Contains(out.String(), "verified           false: verify: tgt-001/k: missing") {
		t.Fatalf("summary:\n%s", out.String())
	}
}

func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "relay ") || !strings.Contains(out.String(), "go1.") {
		t.Fatalf("exit %d: %q %q", code, out.String(), errb.String())
	}
}

// A long flag typed with one dash, as edged and the Go tools take them,
// is refused with the spelling that works.
func TestSingleDashLongFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"serve", "-check-config", "--config", "x.yaml"}, &out, &errb); code == 0 {
		t.Fatal("accepted")
	}
	if !strings.Contains(errb.String(), "long flags take two dashes: --check-config") {
		t.Fatalf("stderr: %s", errb.String())
	}
	errb.Reset()
	Run(context.Background(), []string{"serve", "-zzz"}, &out, &errb)
	if strings.Contains(errb.String(), "two dashes") {
		t.Fatalf("hint for a flag that does not exist: %s", errb.String())
	}
}
