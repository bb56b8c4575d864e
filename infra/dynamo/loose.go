package dynamo

import (
	"context"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/relay-dev/relay/relaycore"
)

var _ relaycore.LooseDeleter = (*Store)(nil)

// MaxBatchWriteItems is DynamoDB's limit on requests per BatchWriteItem;
// DeleteLoose sends one request per MaxBatchWriteItems distinct keys.
const MaxBatchWriteItems = 25

// DeleteLoose implements relaycore.LooseDeleter with BatchWriteItem
// DeleteRequests, MaxBatchWriteItems distinct keys each (a request naming
// one key twice is a ValidationException, so duplicates are dropped
// first). DynamoDB bills each delete 1 write unit per started KB of the
// deleted item (1 for an absent one), half what a Delete in a
// TransactWriteItems costs.
//
// Every key is checked before anything is sent: an empty key, a partition
// name outside 1..MaxPartitionLen bytes or a key longer than DynamoDB's
// sort-key limit once encoded is relaycore.ErrInvalidBatch, and nothing is
// deleted. A delete is idempotent, so throttled, not-sent and ambiguous
// requests are simply sent again with the store's back-off, and keys
// DynamoDB leaves in UnprocessedItems are resent after a back-off; a round
// that processes none of them counts as a failed attempt of the
// RetryPolicy. When the attempts run out the error wraps
// ErrRetriesExhausted and relaycore.ErrUnavailable, and any subset of the
// keys may have been deleted (the requests run at once: one failing
// cancels those still in flight).
func (s *Store) DeleteLoose(ctx context.Context, p relaycore.Partition, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete loose %s: %w", p, err)
	}
	todo := make([]string, 0, len(keys))
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if err := checkKey(p, k); err != nil {
			return fmt.Errorf("delete loose %s: key %q: %w", p, clip(k), err)
		}
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		todo = append(todo, k)
	}
	// The requests go at once, up to looseDeletesInFlight: a fire that
	// finished 32 one-row pages waits for one request's latency, not two.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(looseDeletesInFlight)
	for chunk := range slices.Chunk(todo, MaxBatchWriteItems) {
		g.Go(func() error { return s.batchDelete(gctx, p, chunk) })
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("delete loose %s: %w", p, err)
	}
	return nil
}

// looseDeletesInFlight bounds the BatchWriteItem requests one DeleteLoose
// has in flight: a checkpoint's deletes are a few hundred keys at most, so
// four requests send them in one or two round trips without one call
// taking the HTTP client's connections from the rest of the process.
const looseDeletesInFlight = 4

// batchDelete deletes up to MaxBatchWriteItems distinct keys, following
// UnprocessedItems until every key was processed.
func (s *Store) batchDelete(ctx context.Context, p relaycore.Partition, keys []string) error {
	pending := make([]types.WriteRequest, len(keys))
	for i, k := range keys {
		pending[i] = types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: keyOf(p, k)}}
	}
	seed := string(p) + "/" + keys[0]
	rounds := unprocessed{s: s, seed: seed}
	for {
		var resp *dynamodb.BatchWriteItemOutput
		err := s.retrySafe(ctx, seed, func() error {
			s.stats.batchWriteCalls.Add(1)
			var err error
			resp, err = s.client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
				RequestItems: map[string][]types.WriteRequest{s.table: pending},
			}, noSDKRetry)
			return err
		})
		if err != nil {
			return err
		}
		left := resp.UnprocessedItems[s.table]
		// The store does not know the deleted items' sizes: 1 unit each,
		// a lower bound for items over 1 KB.
		done := int64(max(0, len(pending)-len(left)))
		s.stats.looseDeletes.Add(done)
		s.stats.writeUnits.Add(done)
		s.stats.unsized.Add(done)
		if len(left) == 0 {
			return nil
		}
		if err := rounds.resend(ctx, len(pending), len(left)); err != nil {
			return err
		}
		pending = left
	}
}

// clip shortens a key for an error message.
func clip(k string) string {
	if len(k) > 64 {
		return k[:64] + "..."
	}
	return k
}
