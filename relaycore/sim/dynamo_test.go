package sim_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/relaycore/sim"
)

// dynamoOpener starts one in-process DynamoDB-API endpoint (minidyn behind
// real HTTP on 127.0.0.1, through the real aws-sdk-go-v2 client) and gives
// each run two fresh tables, deleted when the run ends. The store's
// back-off sleeps are skipped: with one call at a time nothing throttles,
// and the simulation must not wait on the wall clock.
func dynamoOpener(t *testing.T) opener {
	e := dynamotest.Start(t)
	client := e.Client(nil)
	var n atomic.Int64
	o := dynamo.DefaultCapabilities
	noSleep := func(context.Context, time.Duration) error { return nil }
	return func(sc *sim.Scenario) (sim.Stores, func(), error) {
		ctx := context.Background()
		id := n.Add(1)
		names := []string{fmt.Sprintf("sim-%d-%d-source", sc.Seed, id), fmt.Sprintf("sim-%d-%d-target", sc.Seed, id)}
		for _, name := range names {
			if err := dynamo.CreateTable(ctx, client, name); err != nil {
				return sim.Stores{}, nil, err
			}
		}
		stores := sim.Stores{
			Source: dynamo.New(client, names[0], dynamo.Options{Capabilities: sc.SourceLimits.Caps(o), DueMode: dynamo.DueScan, Sleep: noSleep}),
			Target: dynamo.New(client, names[1], dynamo.Options{Capabilities: sc.TargetLimits.Caps(o), DueMode: dynamo.DueScan, Sleep: noSleep}),
		}
		release := func() {
			for _, name := range names {
				if _, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)}); err != nil {
					t.Errorf("delete table %s: %v", name, err)
				}
			}
		}
		return stores, release, nil
	}
}
