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

// itemOf is the item a put writes: key, value (absent when empty) and,
// with a due time, the due-index attributes.
func itemOf(p relaycore.Partition, w *relaycore.Write) map[string]types.AttributeValue {
	item := keyOf(p, w.Key)
	if len(w.Value) > 0 {
		item[AttrValue] = &types.AttributeValueMemberB{Value: w.Value}
	}
	if w.Due != 0 {
		item[AttrDue] = &types.AttributeValueMemberN{Value: strconv.FormatInt(w.Due, 10)}
		item[AttrDueShard] = &types.AttributeValueMemberS{Value: dueShard(p)}
	}
	return item
}

// condition is the ConditionExpression of an action carrying it.pcs, with
// ALL_OLD asked for when there is one: it lets a failure name the
// precondition that was false when several guard one key, and DynamoDB
// returns it at no cost.
func condition(b relaycore.Batch, it txItem) (expression.Expression, *string, types.ReturnValuesOnConditionCheckFailure, error) {
	if len(it.pcs) == 0 {
		return expression.Expression{}, nil, "", nil
	}
	ex, err := conditionOf(b, it.pcs)
	if err != nil {
		return ex, nil, "", fmt.Errorf("condition on %q: %w", it.key, err)
	}
	return ex, ex.Condition(), types.ReturnValuesOnConditionCheckFailureAllOld, nil
}

func (s *Store) buildTx(p relaycore.Partition, b relaycore.Batch, items []txItem) ([]types.TransactWriteItem, error) {
	out := make([]types.TransactWriteItem, 0, len(items))
	table := aws.String(s.table)
	for _, it := range items {
		ex, cond, rv, err := condition(b, it)
		if err != nil {
			return nil, err
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
			out = append(out, types.TransactWriteItem{Put: &types.Put{
				TableName: table, Item: itemOf(p, it.write), ConditionExpression: cond,
				ExpressionAttributeNames: ex.Names(), ExpressionAttributeValues: ex.Values(),
				ReturnValuesOnConditionCheckFailure: rv,
			}})
		}
	}
	return out, nil
}

// SingleItem reports whether Apply sends b as one standard request rather
// than a TransactWriteItems: b touches exactly one key, with at most one
// write and every precondition on that key. One item is atomic by itself,
// and DynamoDB bills a standard write half a transactional one (1 write
// unit per started KB instead of 2). Such a batch goes out as a PutItem or
// DeleteItem whose ConditionExpression carries the preconditions, or, with
// no write, as a strongly consistent GetItem whose item is checked here
// (docs/dynamodb.md, "Apply"). bench's meter prices batches by it too, so
// the two cannot disagree.
func SingleItem(b relaycore.Batch) bool {
	var key string
	switch {
	case len(b.Writes) > 1:
		return false
	case len(b.Writes) == 1:
		key = b.Writes[0].Key
	case len(b.Preconditions) > 0:
		key = b.Preconditions[0].Key
	default:
		return false
	}
	for _, pc := range b.Preconditions {
		if pc.Key != key {
			return false
		}
	}
	return true
}

// attempts is what Apply's retry loop needs from one kind of request.
type attempts struct {
	// send makes one attempt and counts its request.
	send func() error
	// failed names the false precondition of a refused attempt and counts
	// what the refusal cost.
	failed func(err error) *relaycore.ConditionFailedError
	// committed counts a successful attempt.
	committed func()
	// seed decorrelates the default back-off jitter of concurrent calls.
	seed string
}

// Apply implements relaycore.Store. A batch on one key (SingleItem) is one
// PutItem, DeleteItem or, with preconditions only, GetItem; any other batch
// is one TransactWriteItems.
//
// The batch is checked against Capabilities first (minidyn would accept
// more than 100 actions; DynamoDB would refuse them with a validation
// error). One ClientRequestToken is drawn per transaction and reused on
// every retry of this batch, so a retry after a lost response cannot apply
// the batch twice on DynamoDB. PutItem and DeleteItem have no token: a
// retry after an ambiguous attempt runs again, which a guarded write
// detects (its condition then fails, reported as ErrMaybeApplied) and an
// unguarded one repeats (the engine sends none). See the package
// documentation for the error rules.
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
	single := SingleItem(b)
	if single && len(b.Writes) == 0 {
		if err := s.checkOnly(ctx, p, b, items[0]); err != nil {
			return fmt.Errorf("apply %s: %w", p, err)
		}
		return nil
	}
	var (
		a   attempts
		err error
	)
	if single {
		a, err = s.singleWrite(ctx, p, b, items[0])
	} else {
		a, err = s.transaction(ctx, p, b, items)
	}
	if err != nil {
		return fmt.Errorf("apply %s: %w", p, err)
	}
	return s.retryApply(ctx, p, a)
}

// transaction prepares the TransactWriteItems of a batch on several keys.
func (s *Store) transaction(ctx context.Context, p relaycore.Partition, b relaycore.Batch, items []txItem) (attempts, error) {
	actions, err := s.buildTx(p, b, items)
	if err != nil {
		return attempts{}, err
	}
	token := s.opts.NewToken()
	in := &dynamodb.TransactWriteItemsInput{TransactItems: actions, ClientRequestToken: aws.String(token)}
	cost := s.writeCost(p, b, items, 2)
	return attempts{
		send: func() error {
			s.stats.transactCalls.Add(1)
			_, err := s.client.TransactWriteItems(ctx, in, noSDKRetry)
			return err
		},
		failed: func(err error) *relaycore.ConditionFailedError {
			s.stats.canceledWriteUnits.Add(cost.write)
			return s.failedPrecondition(ctx, p, err, b, items)
		},
		committed: func() {
			s.stats.transactions.Add(1)
			s.stats.committed(cost)
		},
		seed: token,
	}, nil
}

// singleWrite prepares the PutItem or DeleteItem of a batch that writes one
// key, its preconditions (all on that key) as the ConditionExpression.
func (s *Store) singleWrite(ctx context.Context, p relaycore.Partition, b relaycore.Batch, it txItem) (attempts, error) {
	ex, cond, rv, err := condition(b, it)
	if err != nil {
		return attempts{}, err
	}
	table := aws.String(s.table)
	var send func() error
	if it.write.Delete {
		in := &dynamodb.DeleteItemInput{
			TableName: table, Key: keyOf(p, it.key), ConditionExpression: cond,
			ExpressionAttributeNames: ex.Names(), ExpressionAttributeValues: ex.Values(),
			ReturnValuesOnConditionCheckFailure: rv,
		}
		send = func() error {
			s.stats.deleteCalls.Add(1)
			_, err := s.client.DeleteItem(ctx, in, noSDKRetry)
			return err
		}
	} else {
		in := &dynamodb.PutItemInput{
			TableName: table, Item: itemOf(p, it.write), ConditionExpression: cond,
			ExpressionAttributeNames: ex.Names(), ExpressionAttributeValues: ex.Values(),
			ReturnValuesOnConditionCheckFailure: rv,
		}
		send = func() error {
			s.stats.putCalls.Add(1)
			_, err := s.client.PutItem(ctx, in, noSDKRetry)
			return err
		}
	}
	cost := s.writeCost(p, b, []txItem{it}, 1)
	return attempts{
		send: send,
		failed: func(err error) *relaycore.ConditionFailedError {
			var ccf *types.ConditionalCheckFailedException
			var item map[string]types.AttributeValue
			if errors.As(err, &ccf) {
				item = ccf.Item
			}
			if len(item) == 0 && len(it.pcs) > 1 {
				// minidyn returns no item (see failedPrecondition).
				item = s.currentItem(ctx, p, it.key)
			}
			// A refused conditional write is billed: 1 unit per started
			// KB of the existing item, at least 1.
			s.stats.writeUnits.Add(writeUnits(attrMapSize(item)))
			if len(item) == 0 {
				s.stats.unsized.Add(1)
			}
			i := firstFalse(b, it.pcs, item)
			return &relaycore.ConditionFailedError{Index: i, Key: b.Preconditions[i].Key}
		},
		committed: func() {
			s.stats.singleWrites.Add(1)
			s.stats.committed(cost)
		},
		seed: string(p) + "/" + it.key,
	}, nil
}

// checkOnly decides a batch of preconditions on one key with one strongly
// consistent GetItem. It is exactly the TransactWriteItems of one
// ConditionCheck it replaces: a strongly consistent read is serializable
// with every write, so the item it returns is the one a ConditionCheck
// would have tested at that moment, and nothing is written either way. It
// costs 1 read unit per started 4 KB instead of 2 write units per started
// KB, and it cannot be ambiguous: a failed read is retried like Get's.
func (s *Store) checkOnly(ctx context.Context, p relaycore.Partition, b relaycore.Batch, it txItem) error {
	var out *dynamodb.GetItemOutput
	err := s.retrySafe(ctx, string(p)+"/"+it.key, func() error {
		s.stats.getCalls.Add(1)
		var err error
		out, err = s.client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: aws.String(s.table), Key: keyOf(p, it.key), ConsistentRead: aws.Bool(true),
		}, noSDKRetry)
		return err
	})
	if err != nil {
		return err
	}
	s.stats.readHalfUnits.Add(2 * readUnits(attrMapSize(out.Item)))
	if i, ok := falseAmong(b, it.pcs, out.Item); ok {
		s.stats.conditionFailed.Add(1)
		return &relaycore.ConditionFailedError{Index: i, Key: b.Preconditions[i].Key}
	}
	s.stats.checks.Add(1)
	return nil
}

// retryApply runs a's attempts until one commits, a condition or a
// refusal decides, or the attempts run out. See the package documentation
// for the error rules.
func (s *Store) retryApply(ctx context.Context, p relaycore.Partition, a attempts) error {
	var firstAmbiguous error
	for n := 1; ; n++ {
		err := a.send()
		if err == nil {
			a.committed()
			return nil
		}
		switch classify(err) {
		case failCondition:
			s.stats.conditionFailed.Add(1)
			cf := a.failed(err)
			if firstAmbiguous != nil {
				// Without a token-honouring endpoint (and for PutItem and
				// DeleteItem, which have no token) the failed condition
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
				return fmt.Errorf("apply %s: %w (%w; last error: %w)", p, ctx.Err(), relaycore.ErrUnavailable, err)
			}
			return fmt.Errorf("apply %s: %w (%w) after %d attempts: %w", p, ErrRetriesExhausted, relaycore.ErrUnavailable, n, err)
		}
		s.stats.retries.Add(1)
		if serr := s.opts.Sleep(ctx, s.backoff(a.seed, n)); serr != nil {
			if firstAmbiguous != nil {
				return fmt.Errorf("apply %s: %w (%w): %w", p, relaycore.ErrMaybeApplied, relaycore.ErrUnavailable, serr)
			}
			return fmt.Errorf("apply %s: %w (%w; last error: %w)", p, serr, relaycore.ErrUnavailable, err)
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

// firstFalse is the lowest-indexed of idx false against item (nil: absent),
// or idx[0] when all hold (the endpoint said one failed; name one).
func firstFalse(b relaycore.Batch, idx []int, item map[string]types.AttributeValue) int {
	if i, ok := falseAmong(b, idx, item); ok {
		return i
	}
	return idx[0]
}

// falseAmong returns the lowest-indexed of idx false against item, and
// whether there is one. The rules are the ConditionExpressions' of
// preconditionExpr.
func falseAmong(b relaycore.Batch, idx []int, item map[string]types.AttributeValue) (int, bool) {
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
			return i, true
		}
	}
	return 0, false
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
