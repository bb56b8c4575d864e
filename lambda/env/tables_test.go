package env

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/internal/silenttest"
)

// CheckTables stops a function whose SOURCE_TABLE or TARGET_TABLE names
// no table (ErrConfig, the variable named) before any call, instead of
// letting every apply fail and quarantine every target; a DynamoDB that
// does not answer is logged and left to the calls.
func TestCheckTables(t *testing.T) {
	ddb := dynamotest.Start(t)
	for _, tbl := range []string{"relay-source", "relay-target"} {
		if err := dynamo.CreateTable(t.Context(), ddb.Client(nil), tbl); err != nil {
			t.Fatal(err)
		}
	}
	awsCfg := aws.Config{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("relay", "relay", "")}
	deps := func(endpoint string, vars map[string]string) (*Deps, *bytes.Buffer) {
		t.Helper()
		m := valid()
		m[VarDynamoDBEndpoint] = endpoint
		for k, v := range vars {
			m[k] = v
		}
		cfg, err := Parse(getenv(m))
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		d, err := Build(cfg, awsCfg, &logs)
		if err != nil {
			t.Fatal(err)
		}
		return d, &logs
	}
	if d, _ := deps(ddb.URL, nil); d.CheckTables(t.Context()) != nil {
		t.Fatalf("both tables exist: %v", d.CheckTables(t.Context()))
	}
	d, _ := deps(ddb.URL, map[string]string{VarTargetTable: "relay-targte"})
	err := d.CheckTables(t.Context())
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `TARGET_TABLE="relay-targte": no such table`) || strings.Contains(err.Error(), "SOURCE_TABLE") {
		t.Fatalf("a misnamed target table: %v", err)
	}

	d, logs := deps("http://"+silenttest.Addr(t), nil) // a DynamoDB that never answers
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := d.CheckTables(ctx); err != nil {
		t.Fatalf("a DynamoDB that does not answer: %v, want it left to the calls", err)
	}
	if !strings.Contains(logs.String(), "table check did not answer") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
}
