package dynamo

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/relay-dev/relay/relaycore"
)

var (
	_ relaycore.Store    = (*Store)(nil)
	_ relaycore.DueIndex = (*Store)(nil)
)

// Attribute and index names: the table layout contract (docs/dynamodb.md).
const (
	AttrPartition = "p"   // partition key (S): the relaycore.Partition
	AttrKey       = "k"   // sort key (S): the key within the partition
	AttrValue     = "v"   // value (B); absent when the value is empty
	AttrDue       = "due" // due time (N, unix ms); only on items written with Write.Due
	AttrDueShard  = "ds"  // due-index shard (S, "d#00".."d#15"); only with due
	DueIndexName  = "due" // sparse GSI: hash ds, range due, keys only
	DueShards     = 16    // number of ds values
)

// itemOverhead is what an item costs DynamoDB beyond len(p)+len(k)+len(v):
// the attribute names p, k, v (3 bytes), due (3 bytes of name + at most 11
// bytes for a 19-digit number: 1 byte per two significant digits + 1) and
// ds (2 bytes of name + 4 bytes of value). See "DynamoDB item sizes and
// formats" in the DynamoDB developer guide.
const itemOverhead = 3 + (3 + 11) + (2 + 4)

// DefaultCapabilities are DynamoDB's TransactWriteItems limits: 100 items,
// 4 MB aggregate item size, 400 KB per item (1 KB = 1024 bytes). The item
// overhead covers attribute names and due attributes (itemOverhead);
// WideNonASCII makes ItemSize count the growth of partition and key by
// encodeKey, so sizes are exact for ASCII keys and never under-count.
var DefaultCapabilities = relaycore.Capabilities{
	MaxBatchItems: 100,
	MaxBatchBytes: 4 << 20,
	MaxItemBytes:  400 << 10,
	ItemOverhead:  itemOverhead,
	WideNonASCII:  true,
}

// DueMode selects how Due reads the due index.
type DueMode int

const (
	// DueGSI queries the sparse global secondary index DueIndexName, one
	// Query per shard. It reads only due items and is what production uses.
	// GSI reads are eventually consistent, which is fine because due
	// entries are hints that the sweeper re-reads.
	DueGSI DueMode = iota
	// DueScan scans the whole table with a filter on due. It costs a read
	// of every item and exists for endpoints whose GSIs are unreliable:
	// minidyn v0.8.2 loses index entries after an item is rewritten without
	// its index attributes and then deleted, and orders numeric index keys
	// as strings. Tests against minidyn use it.
	DueScan
)

// RetryPolicy bounds the store's retries of throttled, conflicting or
// ambiguous requests. Attempt n (n = 1, 2, ...) after a failure waits
// min(Max, Base<<(n-1)), of which the upper half is scaled by the jitter
// source.
type RetryPolicy struct {
	// MaxAttempts is the total number of attempts per call, including the
	// first. Default 6.
	MaxAttempts int
	// Base is the first back-off. Default 25ms.
	Base time.Duration
	// Max caps one back-off. Default 1s. With the defaults the back-offs of
	// one call add up to at most 0.8s, far inside the 10-minute window in
	// which DynamoDB honours a ClientRequestToken.
	Max time.Duration
}

// Options configure a Store. The zero value is usable.
type Options struct {
	// Capabilities override DefaultCapabilities (tests use smaller limits).
	Capabilities relaycore.Capabilities
	// Retry bounds retries; zero fields take their defaults.
	Retry RetryPolicy
	// Jitter returns a number in [0, 1) that scales the upper half of each
	// back-off. When nil, the jitter is derived from the call's request
	// token, so concurrent callers spread out while a test that injects
	// NewToken stays deterministic. Must be safe for concurrent use, like
	// Sleep and NewToken.
	Jitter func() float64
	// Sleep waits for d or until ctx is done. Default: a timer. Tests
	// inject a recorder so they never wait on the wall clock.
	Sleep func(ctx context.Context, d time.Duration) error
	// NewToken returns a fresh ClientRequestToken (at most 36 characters)
	// for one Apply. Default: crypto/rand.Text (26 characters). A token
	// must never be reused for a different batch.
	NewToken func() string
	// DueMode selects how Due reads the index. Default DueGSI.
	DueMode DueMode
	// PageSize is the Scan page when ScanRequest.Limit <= 0. Default 1000.
	PageSize int
}

// Store is the relaycore storage contract on one DynamoDB table. It is
// safe for concurrent use.
type Store struct {
	client *dynamodb.Client
	table  string
	caps   relaycore.Capabilities
	opts   Options
	stats  counters
}

// New returns a store on table, which must have the layout CreateTable
// makes. The client's own retryer is bypassed for the store's calls.
func New(client *dynamodb.Client, table string, opts Options) *Store {
	if opts.Capabilities == (relaycore.Capabilities{}) {
		opts.Capabilities = DefaultCapabilities
	}
	if opts.Retry.MaxAttempts <= 0 {
		opts.Retry.MaxAttempts = 6
	}
	if opts.Retry.Base <= 0 {
		opts.Retry.Base = 25 * time.Millisecond
	}
	if opts.Retry.Max <= 0 {
		opts.Retry.Max = time.Second
	}
	if opts.Sleep == nil {
		opts.Sleep = sleep
	}
	if opts.NewToken == nil {
		opts.NewToken = rand.Text
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 1000
	}
	return &Store{client: client, table: table, caps: opts.Capabilities, opts: opts}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// noSDKRetry switches off the SDK's retryer for one call: the store decides
// what is safe to retry, and an SDK retry of TransactWriteItems would hide
// an ambiguous attempt from it.
func noSDKRetry(o *dynamodb.Options) {
	o.Retryer = aws.NopRetryer{}
	o.RetryMaxAttempts = 0
}

// Capabilities implements relaycore.Store.
func (s *Store) Capabilities() relaycore.Capabilities { return s.caps }

// Table returns the table name.
func (s *Store) Table() string { return s.table }

// Get implements relaycore.Store with a strongly consistent GetItem.
// Retried on throttling and on ambiguous failures (reads change nothing).
func (s *Store) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, fmt.Errorf("get %s/%s: %w", p, key, err)
	}
	if checkKey(p, key) != nil {
		// Nothing can be stored under such a name.
		return nil, false, nil
	}
	var out *dynamodb.GetItemOutput
	err := s.retrySafe(ctx, string(p)+"/"+key, func() error {
		s.stats.getCalls.Add(1)
		var err error
		out, err = s.client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName:      aws.String(s.table),
			Key:            keyOf(p, key),
			ConsistentRead: aws.Bool(true),
		}, noSDKRetry)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("get %s/%s: %w", p, key, err)
	}
	size := 0
	if len(out.Item) > 0 {
		size = attrMapSize(out.Item)
	}
	s.stats.readHalfUnits.Add(2 * readUnits(size))
	if len(out.Item) == 0 {
		return nil, false, nil
	}
	v, err := valueOf(out.Item)
	if err != nil {
		return nil, false, fmt.Errorf("get %s/%s: %w", p, key, err)
	}
	return v, true, nil
}

func checkKey(p relaycore.Partition, key string) error {
	if p == "" || len(p) > relaycore.MaxPartitionLen {
		return fmt.Errorf("%w: partition name must be 1..%d bytes", relaycore.ErrInvalidBatch, relaycore.MaxPartitionLen)
	}
	if key == "" {
		return fmt.Errorf("%w: empty key", relaycore.ErrInvalidBatch)
	}
	return checkKeyLen(key)
}

// valueOf decodes `v`; an item without it holds the empty value.
func valueOf(item map[string]types.AttributeValue) ([]byte, error) {
	av, ok := item[AttrValue]
	if !ok {
		return []byte{}, nil
	}
	b, ok := av.(*types.AttributeValueMemberB)
	if !ok {
		return nil, fmt.Errorf("attribute %q is %T, want B", AttrValue, av)
	}
	return b.Value, nil
}

// Scan implements relaycore.Store with one strongly consistent Query.
//
// The cursor After is expressed in the key condition (k > After, or
// BETWEEN After AND End with both bounds dropped client-side) rather than
// as an ExclusiveStartKey. DynamoDB accepts an ExclusiveStartKey naming a
// deleted item, but minidyn returns an empty page for it, and delivery
// deletes rows between pages all the time. DynamoDB has no exclusive upper
// bound either, so a bounded range asks for BETWEEN and drops k == End;
// Limit is raised by one per dropped bound so a page still carries up to
// Limit keys. Each dropped bound costs at most one extra item read.
func (s *Store) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	if err := ctx.Err(); err != nil {
		return relaycore.ScanPage{}, fmt.Errorf("scan %s: %w", p, err)
	}
	if p == "" || len(p) > relaycore.MaxPartitionLen {
		// An absent partition is an empty range, and no partition can
		// have such a name.
		return relaycore.ScanPage{}, nil
	}
	limit := req.Limit
	if limit <= 0 {
		limit = s.opts.PageSize
	}
	lo, loExclusive := req.Start, false
	if req.After != "" && req.After >= req.Start {
		lo, loExclusive = req.After, true
	}
	if req.End != "" && lo >= req.End {
		return relaycore.ScanPage{}, nil
	}
	pk := expression.Key(AttrPartition).Equal(expression.Value(encodeKey(string(p))))
	sk := expression.Key(AttrKey)
	extra := 0
	var cond expression.KeyConditionBuilder
	switch {
	case req.End != "" && lo == "":
		cond = pk.And(sk.LessThan(expression.Value(encodeKey(req.End))))
	case req.End != "":
		cond = pk.And(sk.Between(expression.Value(encodeKey(lo)), expression.Value(encodeKey(req.End))))
		extra = 1
		if loExclusive {
			extra = 2
		}
	case lo == "":
		cond = pk
	case loExclusive:
		cond = pk.And(sk.GreaterThan(expression.Value(encodeKey(lo))))
	default:
		cond = pk.And(sk.GreaterThanEqual(expression.Value(encodeKey(lo))))
	}
	ex, err := expression.NewBuilder().WithKeyCondition(cond).Build()
	if err != nil {
		return relaycore.ScanPage{}, fmt.Errorf("scan %s: build: %w", p, err)
	}
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.table),
		KeyConditionExpression:    ex.KeyCondition(),
		ExpressionAttributeNames:  ex.Names(),
		ExpressionAttributeValues: ex.Values(),
		ConsistentRead:            aws.Bool(true),
		Limit:                     aws.Int32(int32(min(limit+extra, 1<<30))),
	}
	var out *dynamodb.QueryOutput
	err = s.retrySafe(ctx, string(p)+"/"+lo, func() error {
		s.stats.queryCalls.Add(1)
		var err error
		out, err = s.client.Query(ctx, in, noSDKRetry)
		return err
	})
	if err != nil {
		return relaycore.ScanPage{}, fmt.Errorf("scan %s: %w", p, err)
	}
	size := 0
	for _, it := range out.Items {
		size += attrMapSize(it)
	}
	s.stats.readHalfUnits.Add(2 * readUnits(size))

	var page relaycore.ScanPage
	hitEnd := false
	for _, it := range out.Items {
		k, err := keyAttr(it, AttrKey)
		if err != nil {
			return relaycore.ScanPage{}, fmt.Errorf("scan %s: %w", p, err)
		}
		if loExclusive && k == lo {
			continue
		}
		if req.End != "" && k >= req.End {
			hitEnd = true
			break
		}
		v, err := valueOf(it)
		if err != nil {
			return relaycore.ScanPage{}, fmt.Errorf("scan %s/%s: %w", p, k, err)
		}
		page.Items = append(page.Items, relaycore.Item{Key: k, Value: v})
	}
	switch {
	case len(page.Items) > limit:
		page.Items = page.Items[:limit]
		page.Next = page.Items[limit-1].Key
	case hitEnd:
		// The range is exhausted.
	case len(out.LastEvaluatedKey) > 0 && len(page.Items) > 0:
		page.Next = page.Items[len(page.Items)-1].Key
	case len(out.LastEvaluatedKey) > 0:
		// A page cut short by DynamoDB's 1 MB cap before any kept item:
		// resume after the last key it evaluated.
		k, err := keyAttr(out.LastEvaluatedKey, AttrKey)
		if err != nil {
			return relaycore.ScanPage{}, fmt.Errorf("scan %s: last evaluated key: %w", p, err)
		}
		if k > lo {
			page.Next = k
		}
	}
	return page, nil
}

// tokenJitter derives a deterministic jitter in [0, 1) from a request token
// and attempt number, used when Options.Jitter is nil.
func tokenJitter(token string, attempt int) float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(token))
	_, _ = h.Write([]byte{byte(attempt)})
	return float64(h.Sum64()>>11) / (1 << 53)
}

// backoff returns the wait before attempt n+1 after n failed attempts.
func (s *Store) backoff(token string, n int) time.Duration {
	r := s.opts.Retry
	d := r.Max
	if n-1 < 30 && r.Base<<(n-1) < r.Max {
		d = r.Base << (n - 1)
	}
	j := 0.0
	if s.opts.Jitter != nil {
		j = s.opts.Jitter()
	} else {
		j = tokenJitter(token, n)
	}
	return d/2 + time.Duration(j*float64(d/2))
}

// retrySafe runs a request that is safe to repeat whatever became of an
// earlier attempt (a read, or DeleteLoose's deletes) until it succeeds,
// fails for good, or runs out of attempts. seed decorrelates the default
// jitter of different calls.
func (s *Store) retrySafe(ctx context.Context, seed string, call func() error) error {
	var err error
	for n := 1; ; n++ {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		err = call()
		if err == nil {
			return nil
		}
		c := classify(err)
		if c == failThrottled {
			s.stats.throttles.Add(1)
		}
		if c != failThrottled && c != failAmbiguous && c != failNotSent {
			return err
		}
		if n >= s.opts.Retry.MaxAttempts {
			return fmt.Errorf("%w (%w) after %d attempts: %w", ErrRetriesExhausted, relaycore.ErrUnavailable, n, err)
		}
		s.stats.retries.Add(1)
		if serr := s.opts.Sleep(ctx, s.backoff(seed, n)); serr != nil {
			// The caller ran out of time with the store failing: out of
			// reach for this caller (a host answers "retry later").
			return fmt.Errorf("%w (%w; last error: %w)", serr, relaycore.ErrUnavailable, err)
		}
	}
}

// equalValue reports whether a stored item's value equals want.
func equalValue(item map[string]types.AttributeValue, want []byte) bool {
	v, err := valueOf(item)
	return err == nil && bytes.Equal(v, want)
}
