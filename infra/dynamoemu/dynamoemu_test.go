package dynamoemu_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/relay-dev/relay/infra/dynamotest"
)

// The endpoint honours ClientRequestToken the way DynamoDB documents it:
// a repeat of a committed request succeeds without writing again; the same
// token with a different request is refused.
func TestTokenIdempotency(t *testing.T) {
	ctx := t.Context()
	e := dynamotest.Start(t)
	c := e.Client(nil)
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String("t"),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	create := func(token, id string) error {
		_, err := c.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
			ClientRequestToken: aws.String(token),
			TransactItems: []types.TransactWriteItem{{Put: &types.Put{
				TableName:           aws.String("t"),
				Item:                map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: id}},
				ConditionExpression: aws.String("attribute_not_exists(id)"),
			}}},
		})
		return err
	}
	if err := create("tok-1", "a"); err != nil {
		t.Fatal(err)
	}
	// Executed again, the create-if-absent would fail; the token answers.
	if err := create("tok-1", "a"); err != nil {
		t.Fatalf("repeat with the same token: %v", err)
	}
	var api smithy.APIError
	if err := create("tok-1", "b"); !errors.As(err, &api) || api.ErrorCode() != "IdempotentParameterMismatchException" {
		t.Fatalf("same token, other request = %v, want IdempotentParameterMismatchException", err)
	}
	var tce *types.TransactionCanceledException
	if err := create("tok-2", "a"); !errors.As(err, &tce) {
		t.Fatalf("new token, existing item = %v, want TransactionCanceledException", err)
	}
	if e.Tokens() != 1 {
		t.Fatalf("%d committed tokens, want 1", e.Tokens())
	}
	e.IgnoreTokens()
	if err := create("tok-1", "a"); !errors.As(err, &tce) {
		t.Fatalf("with tokens ignored, the repeat = %v, want it executed (and cancelled)", err)
	}
}

// BatchGetItem and BatchWriteItem refuse a key listed twice, as DynamoDB
// does (minidyn alone answers it), and BatchGetItem otherwise reads
// consistently what was just written.
func TestBatchDuplicateKeys(t *testing.T) {
	ctx := t.Context()
	e := dynamotest.Start(t)
	c := e.Client(nil)
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String("t"),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String("p"), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String("k"), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String("p"), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String("k"), KeyType: types.KeyTypeRange},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	key := func(k string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"p": &types.AttributeValueMemberS{Value: "p"}, "k": &types.AttributeValueMemberS{Value: k}}
	}
	if _, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String("t"), Item: key("a")}); err != nil {
		t.Fatal(err)
	}
	get := func(keys ...string) (*dynamodb.BatchGetItemOutput, error) {
		var ks []map[string]types.AttributeValue
		for _, k := range keys {
			ks = append(ks, key(k))
		}
		return c.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{
			"t": {Keys: ks, ConsistentRead: aws.Bool(true)},
		}})
	}
	out, err := get("a", "b")
	if err != nil || len(out.Responses["t"]) != 1 || len(out.UnprocessedKeys) != 0 {
		t.Fatalf("batch get of one present and one absent key = %+v, %v; want one item", out, err)
	}
	var api smithy.APIError
	if _, err := get("a", "b", "a"); !errors.As(err, &api) || api.ErrorCode() != "ValidationException" {
		t.Fatalf("batch get with a duplicate key = %v, want ValidationException", err)
	}

	// BatchWriteItem refuses a DeleteRequest key listed twice, and
	// deletes nothing.
	del := func(keys ...string) error {
		var rs []types.WriteRequest
		for _, k := range keys {
			rs = append(rs, types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: key(k)}})
		}
		_, err := c.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{"t": rs}})
		return err
	}
	if err := del("a", "b", "a"); !errors.As(err, &api) || api.ErrorCode() != "ValidationException" {
		t.Fatalf("batch write with a duplicate delete = %v, want ValidationException", err)
	}
	if out, err := get("a"); err != nil || len(out.Responses["t"]) != 1 {
		t.Fatalf("a after a refused batch write: %+v, %v", out, err)
	}
	if err := del("a", "b"); err != nil {
		t.Fatal(err)
	}
	if out, err := get("a"); err != nil || len(out.Responses["t"]) != 0 {
		t.Fatalf("a after its delete: %+v, %v", out, err)
	}
}

// DescribeTable while items are written (a relay serve replica starting,
// which checks its tables, while the others enqueue): minidyn's DescribeTable
// reads a table's key list without the table's lock, so the endpoint runs
// it exclusively. Under -race, this test fails without that.
func TestDescribeTableDuringWrites(t *testing.T) {
	ctx := t.Context()
	e := dynamotest.Start(t)
	c := e.Client(nil)
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String("t"),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	done := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String("t"),
				Item: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: strconv.Itoa(i)}}}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range n {
		if _, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String("t")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String("t")})
	if err != nil || aws.ToInt64(out.Table.ItemCount) != n {
		t.Fatalf("item count %v, %v; want %d", out, err, n)
	}
}
