package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// TableInput is the CreateTable request for a relay table: keys p (hash)
// and k (range), on-demand billing (relay traffic is bursty: a fire writes
// in bursts and then sleeps until its alarm), and the sparse keys-only GSI
// DueIndexName on (ds, due).
func TableInput(table string) *dynamodb.CreateTableInput {
	return &dynamodb.CreateTableInput{
		TableName: aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(AttrPartition), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(AttrKey), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(AttrDueShard), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(AttrDue), AttributeType: types.ScalarAttributeTypeN},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(AttrPartition), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(AttrKey), KeyType: types.KeyTypeRange},
		},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{
			IndexName: aws.String(DueIndexName),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(AttrDueShard), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(AttrDue), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly},
		}},
		BillingMode: types.BillingModePayPerRequest,
	}
}

// CreateTable creates a relay table (see TableInput) and waits until it and
// its index are ACTIVE. An existing table with the same key schema is
// accepted, so the call is idempotent. Endpoints that report no status
// (minidyn) count as active at once; the SDK's waiter would wait forever
// on them, which is why this polls DescribeTable itself.
func CreateTable(ctx context.Context, client *dynamodb.Client, table string) error {
	_, err := client.CreateTable(ctx, TableInput(table))
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("create table %s: %w", table, err)
	}
	for {
		d, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			return fmt.Errorf("create table %s: describe: %w", table, err)
		}
		if err := checkSchema(d.Table); err != nil {
			return fmt.Errorf("create table %s: %w", table, err)
		}
		if active(d.Table) {
			return nil
		}
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("create table %s: waiting for ACTIVE: %w", table, ctx.Err())
		case <-t.C:
		}
	}
}

func active(t *types.TableDescription) bool {
	if t.TableStatus != "" && t.TableStatus != types.TableStatusActive {
		return false
	}
	for _, g := range t.GlobalSecondaryIndexes {
		if g.IndexStatus != "" && g.IndexStatus != types.IndexStatusActive {
			return false
		}
	}
	return true
}

func checkSchema(t *types.TableDescription) error {
	want := map[types.KeyType]string{types.KeyTypeHash: AttrPartition, types.KeyTypeRange: AttrKey}
	if len(t.KeySchema) != 2 {
		return fmt.Errorf("key schema has %d elements, want hash %q and range %q", len(t.KeySchema), AttrPartition, AttrKey)
	}
	for _, k := range t.KeySchema {
		if want[k.KeyType] != aws.ToString(k.AttributeName) {
			return fmt.Errorf("key %s is %q, want %q", k.KeyType, aws.ToString(k.AttributeName), want[k.KeyType])
		}
	}
	return nil
}

// CheckTable reads table's description (DescribeTable: nothing is
// written) and checks it has the relay's key schema and, when withDue, its
// due index. A missing table is an error wrapping
// *types.ResourceNotFoundException.
func CheckTable(ctx context.Context, client *dynamodb.Client, table string, withDue bool) error {
	d, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	if err != nil {
		return fmt.Errorf("table %s: %w", table, err)
	}
	if err := checkSchema(d.Table); err != nil {
		return fmt.Errorf("table %s: %w", table, err)
	}
	if withDue {
		found := false
		for _, g := range d.Table.GlobalSecondaryIndexes {
			found = found || aws.ToString(g.IndexName) == DueIndexName
		}
		if !found {
			return fmt.Errorf("table %s: no global secondary index %q (docs/dynamodb.md)", table, DueIndexName)
		}
	}
	return nil
}
