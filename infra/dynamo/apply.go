package dynamo

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/relay-dev/relay/relaycore"
)

// txItem is one TransactWriteItems action and the preconditions it carries.
type txItem struct {
	key   string
	pcs   []int            // indexes into Batch.Preconditions, ascending
	write *relaycore.Write // nil for a ConditionCheck
}

// plan turns a batch into transaction actions: one per written key (its
// preconditions become the action's condition) plus one ConditionCheck per
// key that is only guarded. Guarded actions come first, ordered by their
// lowest precondition index, so an endpoint that stops at the first failed
// action (minidyn) still reports the lowest failed precondition whenever
// each key carries one precondition.
func plan(b relaycore.Batch) []txItem {
	pcs := make(map[string][]int, len(b.Preconditions))
	for i, pc := range b.Preconditions {
		pcs[pc.Key] = append(pcs[pc.Key], i)
	}
	items := make([]txItem, 0, len(b.Writes)+len(pcs))
	for i := range b.Writes {
		w := &b.Writes[i]
		items = append(items, txItem{key: w.Key, pcs: pcs[w.Key], write: w})
		delete(pcs, w.Key)
	}
	for k, idx := range pcs {
		items = append(items, txItem{key: k, pcs: idx})
	}
	first := func(it txItem) int {
		if len(it.pcs) == 0 {
			return math.MaxInt
		}
		return it.pcs[0]
	}
	sort.SliceStable(items, func(i, j int) bool { return first(items[i]) < first(items[j]) })
	return items
}

func preconditionExpr(pc relaycore.Precondition) expression.ConditionBuilder {
	switch {
	case pc.Absent:
		return expression.AttributeNotExists(expression.Name(AttrKey))
	case len(pc.Value) == 0:
		// The empty value is stored without v.
		return expression.AttributeExists(expression.Name(AttrKey)).
			And(expression.AttributeNotExists(expression.Name(AttrValue)))
	default:
		return expression.Name(AttrValue).Equal(expression.Value(&types.AttributeValueMemberB{Value: pc.Value}))
	}
}

// conditionOf builds the condition for a set of preconditions on one key.
func conditionOf(b relaycore.Batch, idx []int) (expression.Expression, error) {
	c := preconditionExpr(b.Preconditions[idx[0]])
	for _, i := range idx[1:] {
		c = c.And(preconditionExpr(b.Preconditions[i]))
	}
	return expression.NewBuilder().WithCondition(c).Build()
}

// dueShard spreads due items over DueShards GSI partitions by a stable
// hash (FNV-1a) of the partition name, so one hot index partition does not
// throttle every alarm write.
func dueShard(p relaycore.Partition) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(p))
	return fmt.Sprintf("d#%02d", h.Sum32()%DueShards)
}

func (s *Store) buildTx(p relaycore.Partition, b relaycore.Batch, items []txItem) ([]types.TransactWriteItem, error) {
	out := make([]types.TransactWriteItem, 0, len(items))
	table := aws.String(s.table)
	for _, it := range items {
		var (
			ex   expression.Expression
			cond *string
			rv   types.ReturnValuesOnConditionCheckFailure
		)
		if len(it.pcs) > 0 {
			var err error
			if ex, err = conditionOf(b, it.pcs); err != nil {
				return nil, fmt.Errorf("condition on %q: %w", it.key, err)
			}
			cond = ex.Condition()
			// ALL_OLD lets a failure name the precondition that was false
			// when several guard one key; DynamoDB returns it at no cost.
			rv = types.ReturnValuesOnConditionCheckFailureAllOld
		}
		switch {
		case it.write == nil:
			out = append(out, types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
				TableName: table, Key: keyOf(p, it.key), ConditionExpression: cond,
				ExpressionAttributeNames: ex.Names(), ExpressionAttributeValues: ex.Values(),
				ReturnValuesOnConditionCheckFailure: rv,
			}})
		case it.write.Delete:
			out = append(out, types.TransactWriteItem{Delete: &types.Delete{
				TableName: table, Key: keyOf(p, it.key), ConditionExpression: cond,
				ExpressionAttributeNames: ex.Names(), ExpressionAttributeValues: ex.Values(),
				ReturnValuesOnConditionCheckFailure: rv,
			}})
		default:
			item := keyOf(p, it.key)
			if len(it.write.Value) > 0 {
				item[AttrValue] = &types.AttributeValueMemberB{Value: it.write.Value}
			}
			if it.write.Due != 0 {
				item[AttrDue] = &types.AttributeValueMemberN{Value: strconv.FormatInt(it.write.Due, 10)}
				item[AttrDueShard] = &types.AttributeValueMemberS{Value: dueShard(p)}
			}
			out = append(out, types.TransactWriteItem{Put: &types.Put{
				TableName: table, Item: item, ConditionExpression: cond,
				ExpressionAttributeNames: ex.Names(), ExpressionAttributeValues: ex.Values(),
				ReturnValuesOnConditionCheckFailure: rv,
			}})
		}
	}
	return out, nil
}

// Apply implements relaycore.Store with one TransactWriteItems.
//
// The batch is checked against Capabilities first (minidyn would accept
// more than 100 actions; DynamoDB would refuse them with a validation
// error). One ClientRequestToken is drawn per Apply and reused on every
// retry of this batch, so a retry after a lost response cannot apply the
// batch twice on DynamoDB. See the package documentation for the error
// rules.
func (s *Store) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	if err := s.caps.Check(p, b); err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	for _, pc := range b.Preconditions {
		if err := checkKeyLen(pc.Key); err != nil {
			return fmt.Errorf("apply %s: precondition key: %w", p, err)
		}
	}
	for _, w := range b.Writes {
		if err := checkKeyLen(w.Key); err != nil {
			return fmt.Errorf("apply %s: write key: %w", p, err)
		}
	}
	items := plan(b)
	actions, err := s.buildTx(p, b, items)
	if err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	token := s.opts.NewToken()
	in := &dynamodb.TransactWriteItemsInput{TransactItems: actions, ClientRequestToken: aws.String(token)}
	cost := s.txCost(p, b, items)

	var firstAmbiguous error
	for n := 1; ; n++ {
		s.stats.transactCalls.Add(1)
		_, err := s.client.TransactWriteItems(ctx, in, noSDKRetry)
		if err == nil {
			s.stats.committed(cost)
			return nil
		}
		switch classify(err) {
		case failCondition:
			s.stats.conditionFailed.Add(1)
			s.stats.canceledWriteUnits.Add(cost.write)
			cf := s.failedPrecondition(ctx, p, err, b, items)
			if firstAmbiguous != nil {
				// Without a token-honouring endpoint the failed condition
				// may be our own earlier write: say "unknown", and do not
				// wrap cf, whose type promises "surely not applied".
				return fmt.Errorf("apply %s: %w: attempt %d found %v after an ambiguous attempt: %v",
					p, relaycore.ErrMaybeApplied, n, cf, firstAmbiguous)
			}
			return fmt.Errorf("apply %s: %w", p, cf)
		case failPermanent:
			if firstAmbiguous != nil {
				return fmt.Errorf("apply %s: %w: attempt %d: %v; earlier attempt: %v",
					p, relaycore.ErrMaybeApplied, n, err, firstAmbiguous)
			}
			return fmt.Errorf("apply %s: %w", p, err)
		case failThrottled:
			s.stats.throttles.Add(1)
		case failAmbiguous:
			s.stats.ambiguous.Add(1)
			if firstAmbiguous == nil {
				firstAmbiguous = err
			}
		}
		if n >= s.opts.Retry.MaxAttempts || ctx.Err() != nil {
			if firstAmbiguous != nil {
				return fmt.Errorf("apply %s: %w (%w): gave up after %d attempts: %w", p, relaycore.ErrMaybeApplied, relaycore.ErrUnavailable, n, err)
			}
			if ctx.Err() != nil {
				return fmt.Errorf("apply %s: %w (last error: %w)", p, ctx.Err(), err)
			}
			return fmt.Errorf("apply %s: %w (%w) after %d attempts: %w", p, ErrRetriesExhausted, relaycore.ErrUnavailable, n, err)
		}
		s.stats.retries.Add(1)
		if serr := s.opts.Sleep(ctx, s.backoff(token, n)); serr != nil {
			if firstAmbiguous != nil {
				return fmt.Errorf("apply %s: %w: %w", p, relaycore.ErrMaybeApplied, serr)
			}
			return fmt.Errorf("apply %s: %w (last error: %w)", p, serr, err)
		}
	}
}

// failedPrecondition maps CancellationReasons back to the lowest-indexed
// precondition that was false. DynamoDB reports a reason for every action;
// with ALL_OLD the reason carries the item as it was, so when several
// preconditions guard one key the false one is found by re-evaluating
// them. A reason without an item means the item was absent on DynamoDB,
// but minidyn never returns the item for a Put or Delete; so when several
// preconditions guard the key, one strongly consistent GetItem decides
// which of them to name (the batch is surely not applied either way, only
// the index is at stake, and a concurrent change can at worst make it name
// another precondition on the same key that is false now).
func (s *Store) failedPrecondition(ctx context.Context, p relaycore.Partition, err error, b relaycore.Batch, items []txItem) *relaycore.ConditionFailedError {
	var tce *types.TransactionCanceledException
	best := -1
	if errors.As(err, &tce) {
		for j, r := range tce.CancellationReasons {
			if aws.ToString(r.Code) != "ConditionalCheckFailed" || j >= len(items) || len(items[j].pcs) == 0 {
				continue
			}
			item := r.Item
			if len(item) == 0 && len(items[j].pcs) > 1 {
				item = s.currentItem(ctx, p, items[j].key)
			}
			i := firstFalse(b, items[j].pcs, item)
			if best < 0 || i < best {
				best = i
			}
		}
	}
	if best < 0 && len(b.Preconditions) == 0 {
		return &relaycore.ConditionFailedError{Index: 0}
	}
	if best < 0 {
		// Reasons that do not line up with the request: name the first
		// precondition rather than lose the "surely not applied" fact.
		best = 0
	}
	return &relaycore.ConditionFailedError{Index: best, Key: b.Preconditions[best].Key}
}

func firstFalse(b relaycore.Batch, idx []int, item map[string]types.AttributeValue) int {
	exists := len(item) > 0
	for _, i := range idx {
		pc := b.Preconditions[i]
		ok := false
		switch {
		case pc.Absent:
			ok = !exists
		default:
			ok = exists && equalValue(item, pc.Value)
		}
		if !ok {
			return i
		}
	}
	return idx[0]
}

// currentItem reads key for failedPrecondition; a failed read counts as
// absent, which only affects which precondition is named.
func (s *Store) currentItem(ctx context.Context, p relaycore.Partition, key string) map[string]types.AttributeValue {
	s.stats.getCalls.Add(1)
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.table), Key: keyOf(p, key), ConsistentRead: aws.Bool(true),
	}, noSDKRetry)
	if err != nil {
		return nil
	}
	s.stats.readHalfUnits.Add(2 * readUnits(attrMapSize(out.Item)))
	return out.Item
}
