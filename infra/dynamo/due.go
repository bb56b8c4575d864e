package dynamo

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/relay-dev/relay/relaycore"
)

// Due implements relaycore.DueIndex: entries with due <= before, oldest
// first, at most limit (limit <= 0: all).
//
// In DueGSI mode it queries each of the DueShards index partitions for its
// own oldest entries (each shard is sorted by due, so limit per shard is
// enough) and merges them. Index reads are eventually consistent: an entry
// may be missing for a moment after its Apply returned, or still present
// after it was rewritten. Entries are hints; the sweeper re-reads the item.
func (s *Store) Due(ctx context.Context, before int64, limit int) ([]relaycore.DueEntry, error) {
	var (
		out []relaycore.DueEntry
		err error
	)
	if s.opts.DueMode == DueScan {
		out, err = s.dueScan(ctx, before)
	} else {
		out, err = s.dueGSI(ctx, before, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("due before %d: %w", before, err)
	}
	slices.SortFunc(out, relaycore.DueEntry.Compare)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (s *Store) dueGSI(ctx context.Context, before int64, limit int) ([]relaycore.DueEntry, error) {
	var out []relaycore.DueEntry
	for shard := range DueShards {
		ds := fmt.Sprintf("d#%02d", shard)
		cond := expression.Key(AttrDueShard).Equal(expression.Value(ds)).
			And(expression.Key(AttrDue).LessThanEqual(expression.Value(before)))
		ex, err := expression.NewBuilder().WithKeyCondition(cond).Build()
		if err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
		var start map[string]types.AttributeValue
		got := 0
		for {
			in := &dynamodb.QueryInput{
				TableName:                 aws.String(s.table),
				IndexName:                 aws.String(DueIndexName),
				KeyConditionExpression:    ex.KeyCondition(),
				ExpressionAttributeNames:  ex.Names(),
				ExpressionAttributeValues: ex.Values(),
				ExclusiveStartKey:         start,
			}
			if limit > 0 {
				in.Limit = aws.Int32(int32(min(limit-got, 1<<30)))
			}
			var q *dynamodb.QueryOutput
			err := s.retrySafe(ctx, ds, func() error {
				s.stats.queryCalls.Add(1)
				var err error
				q, err = s.client.Query(ctx, in, noSDKRetry)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("query %s: %w", ds, err)
			}
			size := 0
			for _, it := range q.Items {
				size += attrMapSize(it)
				e, err := dueEntry(it)
				if err != nil {
					return nil, fmt.Errorf("query %s: %w", ds, err)
				}
				out = append(out, e)
			}
			s.stats.readHalfUnits.Add(readUnits(size)) // eventually consistent: half
			got += len(q.Items)
			if len(q.LastEvaluatedKey) == 0 || (limit > 0 && got >= limit) {
				break
			}
			start = q.LastEvaluatedKey
		}
	}
	return out, nil
}

// dueScan reads the whole table (DueScan mode); see DueMode for why.
func (s *Store) dueScan(ctx context.Context, before int64) ([]relaycore.DueEntry, error) {
	filt := expression.Name(AttrDue).LessThanEqual(expression.Value(before))
	proj := expression.NamesList(expression.Name(AttrPartition), expression.Name(AttrKey), expression.Name(AttrDue))
	ex, err := expression.NewBuilder().WithFilter(filt).WithProjection(proj).Build()
	if err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	var (
		out   []relaycore.DueEntry
		start map[string]types.AttributeValue
	)
	for {
		in := &dynamodb.ScanInput{
			TableName:                 aws.String(s.table),
			FilterExpression:          ex.Filter(),
			ProjectionExpression:      ex.Projection(),
			ExpressionAttributeNames:  ex.Names(),
			ExpressionAttributeValues: ex.Values(),
			ConsistentRead:            aws.Bool(true),
			ExclusiveStartKey:         start,
		}
		var sc *dynamodb.ScanOutput
		err := s.retrySafe(ctx, "due-scan", func() error {
			s.stats.scanCalls.Add(1)
			var err error
			sc, err = s.client.Scan(ctx, in, noSDKRetry)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("scan: %w", err)
		}
		size := 0
		for _, it := range sc.Items {
			size += attrMapSize(it)
			e, err := dueEntry(it)
			if err != nil {
				return nil, fmt.Errorf("scan: %w", err)
			}
			out = append(out, e)
		}
		s.stats.readHalfUnits.Add(2 * readUnits(size))
		if len(sc.LastEvaluatedKey) == 0 {
			return out, nil
		}
		start = sc.LastEvaluatedKey
	}
}

func dueEntry(it map[string]types.AttributeValue) (relaycore.DueEntry, error) {
	p, err := keyAttr(it, AttrPartition)
	if err != nil {
		return relaycore.DueEntry{}, err
	}
	k, err := keyAttr(it, AttrKey)
	if err != nil {
		return relaycore.DueEntry{}, err
	}
	n, ok := it[AttrDue].(*types.AttributeValueMemberN)
	if !ok {
		return relaycore.DueEntry{}, fmt.Errorf("item %s/%s: attribute %q missing or not N", p, k, AttrDue)
	}
	due, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		return relaycore.DueEntry{}, fmt.Errorf("item %s/%s: due: %w", p, k, err)
	}
	return relaycore.DueEntry{Partition: relaycore.Partition(p), Key: k, Due: due}, nil
}
