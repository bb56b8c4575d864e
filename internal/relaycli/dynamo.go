package relaycli

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
	"github.com/relay-dev/relay/internal/demo"
)

// dynamoOptions select the DynamoDB backend of the demo.
type dynamoOptions struct {
	endpoint    string // "" = an in-process DynamoDB-API endpoint (minidyn); "aws" = the SDK's default endpoint
	tablePrefix string
	// reuse lets the demo run on tables that already hold items. Off, such
	// tables are refused: the demo promises to create its tables, and
	// writing a workload into someone's data by accident is worse than
	// asking for a flag.
	reuse bool
	// throttle and drop are the shares of data-plane requests that get a
	// ThrottlingException or lose their response (faultTransport); seed
	// seeds the draws.
	throttle, drop float64
	seed           uint64
}

// openDynamo returns source and target stores on two tables, creating them
// when missing. With no endpoint it starts an in-process minidyn endpoint
// on 127.0.0.1 so the DynamoDB code path (real SDK, real HTTP) can be tried
// without AWS; minidyn's secondary indexes are unreliable, so the due index
// is read by a table scan there (dynamo.DueScan).
//
// The tables are created when missing; tables that already hold items are
// refused unless o.reuse is set. With o.throttle or o.drop set, the stores'
// requests pass through a faultTransport (setup requests do not).
func openDynamo(ctx context.Context, o dynamoOptions) (demo.Stores, func(), error) {
	faults, err := newFaultTransport(http.DefaultTransport, o.throttle, o.drop, o.seed)
	if err != nil {
		return demo.Stores{}, nil, err
	}
	var (
		setup, client *dynamodb.Client
		name          string
		closeFn       = func() {}
		opts          dynamo.Options
	)
	switch o.endpoint {
	case "":
		ep, err := dynamoemu.New()
		if err != nil {
			return demo.Stores{}, nil, err
		}
		closeFn = ep.Close
		setup, client = ep.Client(nil), ep.Client(faults)
		name = "dynamo:in-process minidyn " + ep.URL
		opts.DueMode = dynamo.DueScan
	default:
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return demo.Stores{}, nil, fmt.Errorf("aws config: %w", err)
		}
		endpoint := func(opt *dynamodb.Options) {
			if o.endpoint != "aws" {
				opt.BaseEndpoint = aws.String(o.endpoint)
			}
		}
		setup = dynamodb.NewFromConfig(cfg, endpoint)
		client = setup
		if o.throttle > 0 || o.drop > 0 {
			client = dynamodb.NewFromConfig(cfg, endpoint, func(opt *dynamodb.Options) {
				opt.HTTPClient = &http.Client{Transport: faults}
			})
		}
		name = "dynamo:" + o.endpoint
	}
	srcTable, dstTable := o.tablePrefix+"source", o.tablePrefix+"target"
	for _, t := range []string{srcTable, dstTable} {
		err := dynamo.CreateTable(ctx, setup, t)
		if err == nil && !o.reuse {
			err = refuseNonEmpty(ctx, setup, t)
		}
		if err != nil {
			closeFn()
			return demo.Stores{}, nil, err
		}
	}
	src, dst := dynamo.New(client, srcTable, opts), dynamo.New(client, dstTable, opts)
	units := func() (float64, float64) {
		a, b := src.Stats(), dst.Stats()
		return float64(a.WriteUnits + a.IndexWriteUnits + b.WriteUnits + b.IndexWriteUnits), a.ReadUnits + b.ReadUnits
	}
	return demo.Stores{
		Source: src, Target: dst, Index: src, Name: name, Units: units,
		// A read or an enqueue that used up the store's own retries is
		// surely not applied, or (with an idempotency key) safe to repeat.
		Transient: func(err error) bool { return errors.Is(err, dynamo.ErrRetriesExhausted) },
		Faults:    func() (int64, int64) { return faults.throttled.Load(), faults.dropped.Load() },
	}, closeFn, nil
}

// refuseNonEmpty fails when table holds an item.
func refuseNonEmpty(ctx context.Context, client *dynamodb.Client, table string) error {
	out, err := client.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table), Limit: aws.Int32(1)})
	if err != nil {
		return fmt.Errorf("check table %s is empty: %w", table, err)
	}
	if len(out.Items) > 0 || len(out.LastEvaluatedKey) > 0 {
		return fmt.Errorf("table %s already holds items (an earlier run?): use another --table-prefix, delete the table, or pass --reuse-tables to run on it anyway", table)
	}
	return nil
}
