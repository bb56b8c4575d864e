// Package storetest is the conformance suite for relaycore.Store. Every
// implementation (infra/mem, infra/bolt, infra/dynamo, infra/postgres) calls Run from its own
// tests, so the engine can rely on the written contract rather than on one
// store's habits.
//
// Each leaf subtest gets a fresh store from newStore, so one failure names
// one rule. Sizes are kept modest (tens of keys, a few hundred calls per
// subtest) because the DynamoDB run goes through real HTTP.
//
// Rules proved, by group:
//   - Get: absent partition and key are (nil, false, nil); empty values are
//     present; values are copies in both directions.
//   - GetMany (relaycore.GetMany: the store's BatchGetter, else Get per
//     key): found, absent, empty-valued, unwritable and repeated keys in one
//     call; non-ASCII and long keys; lists longer than DynamoDB's 100 keys
//     per request; an empty list; read-your-writes after Apply; no key of
//     another partition; copies; agreement with Get on every key.
//   - Scan: ascending byte order (prefixes, NUL, 0x7f, 0xff, multi-byte
//     UTF-8), [Start, End) with strict After, paging with any Limit until
//     Next is empty, cursors that always make progress. Keys are arbitrary
//     byte strings, not only UTF-8: a backend that stores text must encode
//     them so they round-trip and keep byte order.
//   - Apply: all-or-nothing; a false precondition at index i returns
//     *ConditionFailedError{Index: i} and changes nothing; empty-but-present
//     is not absent; a precondition and a write on one key are merged;
//     deleting an absent key succeeds; a cancelled context applies nothing.
//   - Limits: MaxBatchItems distinct keys fit and one more is refused with
//     ErrBatchTooLarge; an item of exactly MaxItemBytes fits and one byte
//     more is ErrValueTooLarge; MaxBatchBytes is enforced; malformed batches
//     are ErrInvalidBatch; every refusal applies nothing and is not
//     "maybe applied".
//   - Partitions are isolated from each other, including name prefixes.
//   - Due (when the store implements relaycore.DueIndex): maintained in the
//     same batch as the item, oldest first, bounded by before and limit.
//   - LooseDelete (when the store implements relaycore.LooseDeleter):
//     present and absent keys, repeated keys, lists longer than DynamoDB's
//     25 deletes per request, non-ASCII keys and an empty list; other
//     partitions untouched; a deleted item leaves the due index.
//   - Concurrency: compare-and-swap increments from many goroutines give
//     exactly one winner per version.
//   - Model: a seeded random sequence of batches matches a reference model.
package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// NewStore returns a fresh, empty store for one subtest. It should register
// any cleanup (closing files, deleting tables) with t.Cleanup.
type NewStore func(t *testing.T) relaycore.Store

type suiteCase struct {
	name string
	fn   func(t *testing.T, s relaycore.Store)
}

// Run runs the whole conformance suite as subtests of t. newStore must
// return an empty store each time it is called; the Due tests in particular
// count every entry of the store's index.
func Run(t *testing.T, newStore func(t *testing.T) relaycore.Store) {
	t.Helper()
	groups := []struct {
		name  string
		cases []suiteCase
	}{
		{"Get", getCases()},
		{"GetMany", getManyCases()},
		{"Scan", scanCases()},
		{"Apply", applyCases()},
		{"Limits", limitCases()},
		{"Partitions", partitionCases()},
		{"Due", dueCases()},
		{"LooseDelete", looseDeleteCases()},
		{"Concurrency", concurrencyCases()},
		{"Model", modelCases()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					c.fn(t, newStore(t))
				})
			}
		})
	}
}

// put and del build writes tersely.
func put(key, value string) relaycore.Write {
	return relaycore.Write{Key: key, Value: []byte(value)}
}

func del(key string) relaycore.Write {
	return relaycore.Write{Key: key, Delete: true}
}

func is(key, value string) relaycore.Precondition {
	return relaycore.Precondition{Key: key, Value: []byte(value)}
}

func absent(key string) relaycore.Precondition {
	return relaycore.Precondition{Key: key, Absent: true}
}

func writes(ws ...relaycore.Write) relaycore.Batch { return relaycore.Batch{Writes: ws} }

func mustApply(t *testing.T, s relaycore.Store, p relaycore.Partition, b relaycore.Batch) {
	t.Helper()
	if err := s.Apply(t.Context(), p, b); err != nil {
		t.Fatalf("apply %s: %v", p, err)
	}
}

func mustGet(t *testing.T, s relaycore.Store, p relaycore.Partition, key string) ([]byte, bool) {
	t.Helper()
	v, ok, err := s.Get(t.Context(), p, key)
	if err != nil {
		t.Fatalf("get %s/%q: %v", p, key, err)
	}
	return v, ok
}

// wantValue checks that key holds want in p.
func wantValue(t *testing.T, s relaycore.Store, p relaycore.Partition, key, want string) {
	t.Helper()
	v, ok := mustGet(t, s, p, key)
	if !ok {
		t.Fatalf("get %s/%q: absent, want %q", p, key, want)
	}
	if string(v) != want {
		t.Fatalf("get %s/%q = %q, want %q", p, key, v, want)
	}
}

func wantAbsent(t *testing.T, s relaycore.Store, p relaycore.Partition, key string) {
	t.Helper()
	if v, ok := mustGet(t, s, p, key); ok {
		t.Fatalf("get %s/%q = %q, want absent", p, key, v)
	}
}

// scanAll pages through req until Next is empty, checking every page
// against the paging rules, and returns the items in order.
func scanAll(t *testing.T, s relaycore.Store, p relaycore.Partition, req relaycore.ScanRequest) []relaycore.Item {
	t.Helper()
	ctx := t.Context()
	var out []relaycore.Item
	// A page may be empty while Next is set, but every cursor must move
	// forward, so the number of pages is bounded by the number of keys in
	// the range plus a few empty pages. 10000 is far beyond any suite size.
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatalf("scan %s %s: more than 10000 pages; cursor is not making progress", p, fmtReq(req))
		}
		page, err := s.Scan(ctx, p, req)
		if err != nil {
			t.Fatalf("scan %s %s: %v", p, fmtReq(req), err)
		}
		if req.Limit > 0 && len(page.Items) > req.Limit {
			t.Fatalf("scan %s %s: %d items, limit %d", p, fmtReq(req), len(page.Items), req.Limit)
		}
		for _, it := range page.Items {
			if it.Key < req.Start || (req.End != "" && it.Key >= req.End) {
				t.Fatalf("scan %s %s: key %q outside [%q, %q)", p, fmtReq(req), it.Key, req.Start, req.End)
			}
			if req.After != "" && it.Key <= req.After {
				t.Fatalf("scan %s %s: key %q not after %q", p, fmtReq(req), it.Key, req.After)
			}
			if n := len(out); n > 0 && it.Key <= out[n-1].Key {
				t.Fatalf("scan %s %s: key %q after %q: not ascending", p, fmtReq(req), it.Key, out[n-1].Key)
			}
			out = append(out, it)
		}
		if page.Next == "" {
			return out
		}
		if req.After != "" && page.Next <= req.After {
			t.Fatalf("scan %s %s: Next %q does not advance past After", p, fmtReq(req), page.Next)
		}
		if n := len(page.Items); n > 0 && page.Next < page.Items[n-1].Key {
			t.Fatalf("scan %s %s: Next %q is before the page's last key %q", p, fmtReq(req), page.Next, page.Items[n-1].Key)
		}
		req.After = page.Next
	}
}

// snapshot is the whole content of p, for "nothing changed" checks.
func snapshot(t *testing.T, s relaycore.Store, p relaycore.Partition) []relaycore.Item {
	t.Helper()
	return scanAll(t, s, p, relaycore.ScanRequest{})
}

func sameItems(a, b []relaycore.Item) bool {
	return slices.EqualFunc(a, b, func(x, y relaycore.Item) bool {
		return x.Key == y.Key && bytes.Equal(x.Value, y.Value)
	})
}

func wantUnchanged(t *testing.T, s relaycore.Store, p relaycore.Partition, before []relaycore.Item) {
	t.Helper()
	if after := snapshot(t, s, p); !sameItems(before, after) {
		t.Fatalf("partition %s changed by a refused batch:\nbefore %s\nafter  %s", p, fmtItems(before), fmtItems(after))
	}
}

func fmtItems(items []relaycore.Item) string {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, it := range items {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%q=%q", it.Key, it.Value)
	}
	b.WriteByte(']')
	return b.String()
}

// wantRefused checks err is a surely-not-applied error matching target.
func wantRefused(t *testing.T, err, target error) {
	t.Helper()
	if err == nil {
		t.Fatalf("apply succeeded, want %v", target)
	}
	if !errors.Is(err, target) {
		t.Fatalf("apply error %q does not wrap %q", err, target)
	}
	if relaycore.MayBeApplied(err) {
		t.Fatalf("apply error %q reports maybe-applied; a refusal is surely not applied", err)
	}
	if _, ok := relaycore.FailedPrecondition(err); ok {
		t.Fatalf("apply error %q is a ConditionFailedError, want %v", err, target)
	}
}

// wantConditionFailed checks err names precondition index of b.
func wantConditionFailed(t *testing.T, err error, b relaycore.Batch, index int) {
	t.Helper()
	if err == nil {
		t.Fatalf("apply succeeded, want precondition %d to fail", index)
	}
	var cf *relaycore.ConditionFailedError
	if !errors.As(err, &cf) {
		t.Fatalf("apply error %q (%T) is not a *ConditionFailedError", err, err)
	}
	if cf.Index != index {
		t.Fatalf("ConditionFailedError.Index = %d, want %d (%v)", cf.Index, index, err)
	}
	if cf.Key != b.Preconditions[index].Key {
		t.Fatalf("ConditionFailedError.Key = %q, want %q", cf.Key, b.Preconditions[index].Key)
	}
	if relaycore.MayBeApplied(err) {
		t.Fatalf("condition failure %q reports maybe-applied", err)
	}
	if i, ok := relaycore.FailedPrecondition(err); !ok || i != index {
		t.Fatalf("FailedPrecondition(%q) = %d, %v; want %d, true", err, i, ok, index)
	}
}

func fmtReq(r relaycore.ScanRequest) string {
	return fmt.Sprintf("{Start:%q End:%q After:%q Limit:%d}", r.Start, r.End, r.After, r.Limit)
}

func fmtBatch(b relaycore.Batch) string {
	var s bytes.Buffer
	for i, pc := range b.Preconditions {
		if pc.Absent {
			fmt.Fprintf(&s, "pc%d %q absent; ", i, pc.Key)
		} else {
			fmt.Fprintf(&s, "pc%d %q==%q; ", i, pc.Key, pc.Value)
		}
	}
	for _, w := range b.Writes {
		switch {
		case w.Delete:
			fmt.Fprintf(&s, "del %q; ", w.Key)
		case w.Due != 0:
			fmt.Fprintf(&s, "put %q=%q due %d; ", w.Key, w.Value, w.Due)
		default:
			fmt.Fprintf(&s, "put %q=%q; ", w.Key, w.Value)
		}
	}
	return s.String()
}
