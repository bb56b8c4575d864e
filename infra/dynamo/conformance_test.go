package dynamo_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/storetest"
)

// tableSeq numbers the tables a test run creates; a run against a shared
// endpoint also prefixes them with the start time so reruns never collide.
var tableSeq atomic.Int64

// target returns a client and a fresh, empty relay table. With
// RELAY_DYNAMODB_ENDPOINT set it uses that endpoint (credentials and region
// from the usual AWS environment) and deletes the table when the test ends;
// otherwise it uses an in-process minidyn endpoint started for the test.
func target(t *testing.T) (*dynamodb.Client, string, *dynamoemu.Endpoint) {
	t.Helper()
	ctx := t.Context()
	name := fmt.Sprintf("relay-test-%d-%d", time.Now().Unix(), tableSeq.Add(1))
	if url := os.Getenv(dynamotest.EndpointEnv); url != "" {
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			t.Fatalf("aws config: %v", err)
		}
		if cfg.Region == "" {
			cfg.Region = "us-east-1"
		}
		client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(url) })
		if err := dynamo.CreateTable(ctx, client, name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)}); err != nil {
				t.Errorf("delete table %s: %v", name, err)
			}
		})
		return client, name, nil
	}
	e := dynamotest.Start(t)
	client := e.Client(nil)
	if err := dynamo.CreateTable(ctx, client, name); err != nil {
		t.Fatal(err)
	}
	return client, name, e
}

// TestConformance runs the shared storage-contract suite through the real
// SDK over real HTTP. Due uses DueScan: minidyn's GSI is unreliable (see
// dynamo.DueScan) and a real GSI is eventually consistent, while the suite
// reads the index right after writing it. TestDueGSI covers the GSI path.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) relaycore.Store {
		client, table, _ := target(t)
		return dynamo.New(client, table, dynamo.Options{DueMode: dynamo.DueScan})
	})
}
