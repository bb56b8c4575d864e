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
