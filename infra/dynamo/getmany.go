package dynamo

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/relay-dev/relay/relaycore"
)

var _ relaycore.BatchGetter = (*Store)(nil)

// MaxBatchGetKeys is DynamoDB's limit on keys per BatchGetItem request;
// GetMany sends one request per MaxBatchGetKeys distinct keys.
const MaxBatchGetKeys = 100

// GetMany implements relaycore.BatchGetter with strongly consistent
// BatchGetItem requests of at most MaxBatchGetKeys distinct keys each (a
// request naming one key twice is a ValidationException, so duplicates are
// dropped first). DynamoDB reads every key of a request on its own: each
// value is current as of some moment during the call, but two keys are not
// read from one snapshot.
//
// Transport failures are retried like Get's (reads change nothing). Keys
// that DynamoDB leaves in UnprocessedKeys (throughput, or its 16 MB and
// 1 MB-per-partition response caps) are requested again after a back-off;
// a round that reads none of them counts as a failed attempt of the
// RetryPolicy, so a table that is throttled for good ends in
// ErrRetriesExhausted while responses cut short by size always finish.
func (s *Store) GetMany(ctx context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get many %s: %w", p, err)
	}
	out := make(map[string][]byte, len(keys))
	todo := make([]string, 0, len(keys))
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if checkKey(p, k) != nil {
			// Nothing can be stored under such a name.
			continue
		}
		todo = append(todo, k)
	}
	for len(todo) > 0 {
		n := min(len(todo), MaxBatchGetKeys)
		if err := s.batchGet(ctx, p, todo[:n], out); err != nil {
			return nil, fmt.Errorf("get many %s: %w", p, err)
		}
		todo = todo[n:]
	}
	return out, nil
}

// batchGet reads up to MaxBatchGetKeys distinct keys into out, following
// UnprocessedKeys until every key was read.
func (s *Store) batchGet(ctx context.Context, p relaycore.Partition, keys []string, out map[string][]byte) error {
	pending := make([]map[string]types.AttributeValue, len(keys))
	for i, k := range keys {
		pending[i] = keyOf(p, k)
	}
	seed := string(p) + "/" + keys[0]
	rounds := unprocessed{s: s, seed: seed}
	for {
		var resp *dynamodb.BatchGetItemOutput
		err := s.retrySafe(ctx, seed, func() error {
			s.stats.batchGetCalls.Add(1)
			var err error
			resp, err = s.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
				RequestItems: map[string]types.KeysAndAttributes{
					s.table: {Keys: pending, ConsistentRead: aws.Bool(true)},
				},
			}, noSDKRetry)
			return err
		})
		if err != nil {
			return err
		}
		items := resp.Responses[s.table]
		for _, it := range items {
			k, err := keyAttr(it, AttrKey)
			if err != nil {
				return err
			}
			v, err := valueOf(it)
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			out[k] = v
			// DynamoDB bills each key of a BatchGetItem as its own GetItem.
			s.stats.readHalfUnits.Add(2 * readUnits(attrMapSize(it)))
		}
		left := resp.UnprocessedKeys[s.table].Keys
		// Keys read and found absent cost one unit each, like GetItem.
		s.stats.readHalfUnits.Add(2 * int64(max(0, len(pending)-len(left)-len(items))))
		if len(left) == 0 {
			return nil
		}
		if err := rounds.resend(ctx, len(pending), len(left)); err != nil {
			return err
		}
		pending = left
	}
}

// unprocessed paces the resends of what a batch request left unprocessed
// (BatchGetItem's UnprocessedKeys, BatchWriteItem's UnprocessedItems: what
// DynamoDB returns when throttled): back-off between rounds, and an error
// once MaxAttempts rounds in a row processed nothing.
type unprocessed struct {
	s      *Store
	seed   string
	round  int
	stalls int // rounds in a row that processed nothing
}

// resend records a round that left left of sent keys unprocessed and waits
// before the next one.
func (u *unprocessed) resend(ctx context.Context, sent, left int) error {
	s := u.s
	u.round++
	s.stats.throttles.Add(1)
	if left < sent {
		u.stalls = 0
	} else {
		u.stalls++
	}
	if u.stalls >= s.opts.Retry.MaxAttempts {
		return fmt.Errorf("%w (%w) after %d attempts: %d keys unprocessed", ErrRetriesExhausted, relaycore.ErrUnavailable, u.stalls, left)
	}
	s.stats.retries.Add(1)
	if err := s.opts.Sleep(ctx, s.backoff(u.seed, min(u.round, 30))); err != nil {
		return fmt.Errorf("%w (%d keys unprocessed)", err, left)
	}
	return nil
}
