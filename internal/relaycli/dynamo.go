package relaycli

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/internal/demo"
)

// dynamoOptions select the DynamoDB backend of the demo.
type dynamoOptions struct {
	endpoint    string // "" = an in-process DynamoDB-API endpoint (minidyn); "aws" = the SDK's default endpoint
	tablePrefix string
}

// openDynamo returns source and target stores on two tables, creating them
// when missing. With no endpoint it starts an in-process minidyn endpoint
// on 127.0.0.1 so the DynamoDB code path (real SDK, real HTTP) can be tried
// without AWS; minidyn's secondary indexes are unreliable, so the due index
// is read by a table scan there (dynamo.DueScan).
func openDynamo(ctx context.Context, o dynamoOptions) (demo.Stores, func(), error) {
	var (
		client  *dynamodb.Client
		name    string
		closeFn = func() {}
		opts    dynamo.Options
	)
	switch o.endpoint {
	case "":
		ep := dynamotest.New()
		closeFn = ep.Close
		client = ep.Client(nil)
		name = "dynamo:in-process minidyn " + ep.URL
		opts.DueMode = dynamo.DueScan
	default:
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return demo.Stores{}, nil, fmt.Errorf("aws config: %w", err)
		}
		client = dynamodb.NewFromConfig(cfg, func(opt *dynamodb.Options) {
			if o.endpoint != "aws" {
				opt.BaseEndpoint = aws.String(o.endpoint)
			}
		})
		name = "dynamo:" + o.endpoint
	}
	srcTable, dstTable := o.tablePrefix+"source", o.tablePrefix+"target"
	for _, t := range []string{srcTable, dstTable} {
		if err := dynamo.CreateTable(ctx, client, t); err != nil {
			closeFn()
			return demo.Stores{}, nil, err
		}
	}
	src, dst := dynamo.New(client, srcTable, opts), dynamo.New(client, dstTable, opts)
	units := func() (float64, float64) {
		a, b := src.Stats(), dst.Stats()
		return float64(a.WriteUnits + a.IndexWriteUnits + b.WriteUnits + b.IndexWriteUnits), a.ReadUnits + b.ReadUnits
	}
	return demo.Stores{Source: src, Target: dst, Index: src, Name: name, Units: units}, closeFn, nil
}
