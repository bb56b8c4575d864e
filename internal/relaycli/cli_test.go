package relaycli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
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
