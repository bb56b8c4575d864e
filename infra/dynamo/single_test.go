package dynamo_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
	"github.com/relay-dev/relay/relaycore"
)

// opsRT records the operation of every request it passes on.
type opsRT struct {
	next http.RoundTripper

	mu  sync.Mutex
	ops []string
}

func (o *opsRT) RoundTrip(r *http.Request) (*http.Response, error) {
	op := r.Header.Get("X-Amz-Target")
	o.mu.Lock()
	o.ops = append(o.ops, op[strings.LastIndexByte(op, '.')+1:])
	o.mu.Unlock()
	return o.next.RoundTrip(r)
}

// take returns the operations recorded since the last take.
func (o *opsRT) take() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := strings.Join(o.ops, " ")
	o.ops = nil
	return s
}

// A batch on one key goes out as one standard request, with every outcome
// of the transaction it replaces: applied, refused naming the false
// precondition (of several on the key too), nothing changed on refusal.
func TestSingleItemBatches(t *testing.T) {
	r := newRig(t, &opsRT{next: http.DefaultTransport}, 3)
	r.rt.take() // the table's creation
	ctx := t.Context()
	is := func(k, v string) relaycore.Precondition { return relaycore.Precondition{Key: k, Value: []byte(v)} }
	absent := func(k string) relaycore.Precondition { return relaycore.Precondition{Key: k, Absent: true} }
	put := func(k, v string) relaycore.Write { return relaycore.Write{Key: k, Value: []byte(v)} }
	del := func(k string) relaycore.Write { return relaycore.Write{Key: k, Delete: true} }
	batch := func(w []relaycore.Write, pcs ...relaycore.Precondition) relaycore.Batch {
		return relaycore.Batch{Preconditions: pcs, Writes: w}
	}
	one := func(w relaycore.Write) []relaycore.Write { return []relaycore.Write{w} }
	cases := []struct {
		name   string
		b      relaycore.Batch
		failed int // index of the false precondition, -1: applied
		sent   string
		k, v   string // afterwards: key k holds v ("" with absent)
		absent bool
	}{
		{"unguarded put", batch(one(put("k", "1"))), -1, "PutItem", "k", "1", false},
		{"create if absent, refused", batch(one(put("k", "x")), absent("k")), 0, "PutItem", "k", "1", false},
		{"compare and swap", batch(one(put("k", "2")), is("k", "1")), -1, "PutItem", "k", "2", false},
		{"compare and swap, refused", batch(one(put("k", "3")), is("k", "1")), 0, "PutItem", "k", "2", false},
		// minidyn returns no item with the refusal: one GetItem names
		// which of the key's preconditions is false.
		{"second of two false", batch(one(put("k", "3")), is("k", "2"), absent("k")), 1, "PutItem GetItem", "k", "2", false},
		{"first of two false", batch(one(put("k", "3")), absent("k"), is("k", "2")), 0, "PutItem GetItem", "k", "2", false},
		{"empty value", batch(one(relaycore.Write{Key: "e", Value: []byte{}}), absent("e")), -1, "PutItem", "e", "", false},
		{"empty value is not absent", batch(one(put("e", "x")), absent("e")), 0, "PutItem", "e", "", false},
		{"compare and delete, refused", batch(one(del("k")), is("k", "1")), 0, "DeleteItem", "k", "2", false},
		{"compare and delete", batch(one(del("k")), is("k", "2")), -1, "DeleteItem", "k", "", true},
		{"delete an absent key", batch(one(del("k"))), -1, "DeleteItem", "k", "", true},
		{"check that holds", batch(nil, absent("k")), -1, "GetItem", "k", "", true},
		{"check that fails", batch(nil, absent("e"), is("e", "")), 0, "GetItem", "e", "", false},
		{"second check fails", batch(nil, is("e", ""), is("e", "x")), 1, "GetItem", "e", "", false},
		// Two keys: a transaction, as before.
		{"two keys", batch([]relaycore.Write{put("a", "1"), put("b", "1")}, absent("a")), -1, "TransactWriteItems", "b", "1", false},
		{"one write guarded by another key", batch(one(put("c", "1")), is("a", "1")), -1, "TransactWriteItems", "c", "1", false},
	}
	for _, c := range cases {
		if !dynamo.SingleItem(c.b) != (c.sent == "TransactWriteItems") {
			t.Fatalf("%s: SingleItem = %v, but the batch goes out as %s", c.name, dynamo.SingleItem(c.b), c.sent)
		}
		st0 := r.store.Stats()
		err := r.store.Apply(ctx, "p", c.b)
		switch i, ok := relaycore.FailedPrecondition(err); {
		case c.failed < 0 && err != nil:
			t.Fatalf("%s: apply = %v, want applied", c.name, err)
		case c.failed >= 0 && (!ok || i != c.failed || relaycore.MayBeApplied(err)):
			t.Fatalf("%s: apply = %v, want precondition %d failed, surely not applied", c.name, err, c.failed)
		}
		if got := r.rt.take(); got != c.sent {
			t.Errorf("%s: sent %q, want %q", c.name, got, c.sent)
		}
		v, ok, err := r.store.Get(ctx, "p", c.k)
		r.rt.take()
		if err != nil || ok == c.absent || string(v) != c.v {
			t.Errorf("%s: afterwards %s = %q, %v, %v; want %q (absent %v)", c.name, c.k, v, ok, err, c.v, c.absent)
		}
		st := r.store.Stats()
		single, failed := st.SingleWrites+st.Checks-st0.SingleWrites-st0.Checks, st.ConditionFailed-st0.ConditionFailed
		if c.sent != "TransactWriteItems" && (c.failed < 0) != (single == 1 && failed == 0) {
			t.Errorf("%s: %d single applies and %d refusals counted", c.name, single, failed)
		}
	}
}

// A single put with a due time carries the same due-index attributes a
// transaction writes, and shows in the due index.
func TestSingleItemDueAttributes(t *testing.T) {
	r := newRig(t, &opsRT{next: http.DefaultTransport}, 3)
	r.rt.take() // the table's creation
	ctx := t.Context()
	const due = int64(1_764_000_000_000)
	if err := r.store.Apply(ctx, "src", relaycore.Batch{Writes: []relaycore.Write{{Key: "alarm", Value: []byte("{}"), Due: due}}}); err != nil {
		t.Fatal(err)
	}
	if err := r.store.Apply(ctx, "src", relaycore.Batch{Writes: []relaycore.Write{{Key: "alarm2", Value: []byte("{}"), Due: due}, {Key: "x"}}}); err != nil {
		t.Fatal(err)
	}
	if got := r.rt.take(); got != "PutItem TransactWriteItems" {
		t.Fatalf("sent %q", got)
	}
	raw := func(k string) map[string]types.AttributeValue {
		out, err := r.ep.Client(nil).GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(rigTable),
			Key: map[string]types.AttributeValue{"p": &types.AttributeValueMemberS{Value: "src"}, "k": &types.AttributeValueMemberS{Value: k}}})
		if err != nil {
			t.Fatal(err)
		}
		delete(out.Item, dynamo.AttrKey)
		return out.Item
	}
	single, tx := raw("alarm"), raw("alarm2")
	if !reflect.DeepEqual(single, tx) || len(single) != 4 {
		t.Fatalf("single put item %s, transaction's %s", dynamoemu.CanonicalJSON(mustJSON(t, single)), dynamoemu.CanonicalJSON(mustJSON(t, tx)))
	}
	ds, _ := single[dynamo.AttrDueShard].(*types.AttributeValueMemberS)
	n, _ := single[dynamo.AttrDue].(*types.AttributeValueMemberN)
	if ds == nil || !strings.HasPrefix(ds.Value, "d#") || n == nil || n.Value != fmt.Sprint(due) {
		t.Fatalf("due attributes %s", mustJSON(t, single))
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A guarded single put whose response was lost: the retry (PutItem has no
// ClientRequestToken) fails the condition on the first attempt's own
// write. That is "maybe applied", never "precondition failed".
func TestSingleWriteLostResponseIsMaybeApplied(t *testing.T) {
	r := newOpFaultRig(t, "PutItem", 4)
	ctx := t.Context()
	guarded := relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "n", Absent: true}},
		Writes: []relaycore.Write{{Key: "n", Value: []byte("1")}}}
	r.rt.then(drop)
	err := r.store.Apply(ctx, "p", guarded)
	if !relaycore.MayBeApplied(err) {
		t.Fatalf("apply = %v, want maybe-applied", err)
	}
	if _, ok := relaycore.FailedPrecondition(err); ok {
		t.Fatalf("apply = %v is a ConditionFailedError, which promises the batch was not applied", err)
	}
	if v, ok, _ := r.store.Get(ctx, "p", "n"); !ok || string(v) != "1" {
		t.Fatalf("n = %q, %v; the first attempt landed", v, ok)
	}
	if tokens, _ := r.rt.sent(); len(tokens) != 2 {
		t.Fatalf("%d PutItem requests, want 2", len(tokens))
	}
	if st := r.store.Stats(); st.Ambiguous != 1 || st.PutItem != 2 || st.TransactWriteItems != 0 || st.SingleWrites != 0 {
		t.Fatalf("stats %+v", st)
	}

	// The same after a 5xx that in fact applied nothing: the retry
	// applies it once.
	cas := relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "n", Value: []byte("1")}},
		Writes: []relaycore.Write{{Key: "n", Value: []byte("2")}}}
	r.rt.then(fail500, fail500)
	if err := r.store.Apply(ctx, "p", cas); err != nil {
		t.Fatalf("apply after two 500s: %v", err)
	}
	// Only 5xx: unknown, and unavailable.
	r.rt.then(fail500, fail500, fail500, fail500)
	cas = relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "n", Value: []byte("2")}},
		Writes: []relaycore.Write{{Key: "n", Value: []byte("3")}}}
	err = r.store.Apply(ctx, "p", cas)
	if !relaycore.MayBeApplied(err) || !errors.Is(err, relaycore.ErrUnavailable) {
		t.Fatalf("apply after only 500s = %v, want maybe-applied and unavailable", err)
	}
}

// Throttling is retried; when it lasts the single write is surely not
// applied; a real condition failure after a throttle is a plain one.
func TestSingleWriteThrottled(t *testing.T) {
	r := newOpFaultRig(t, "DeleteItem", 3)
	ctx := t.Context()
	if err := r.store.Apply(ctx, "p", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("v")}}}); err != nil {
		t.Fatal(err)
	}
	cad := relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "k", Value: []byte("v")}},
		Writes: []relaycore.Write{{Key: "k", Delete: true}}}
	r.rt.then(throttle, conflict, throttle)
	err := r.store.Apply(ctx, "p", cad)
	if !errors.Is(err, dynamo.ErrRetriesExhausted) || !errors.Is(err, relaycore.ErrUnavailable) || relaycore.MayBeApplied(err) {
		t.Fatalf("apply throttled on every attempt = %v, want retries exhausted, surely not applied", err)
	}
	if _, ok, _ := r.store.Get(ctx, "p", "k"); !ok {
		t.Fatal("k deleted by a refused delete")
	}
	r.rt.then(throttle, conflict)
	if err := r.store.Apply(ctx, "p", cad); err != nil {
		t.Fatalf("apply after two refusals: %v", err)
	}
	r.rt.then(throttle)
	err = r.store.Apply(ctx, "p", cad)
	if i, ok := relaycore.FailedPrecondition(err); !ok || i != 0 || relaycore.MayBeApplied(err) {
		t.Fatalf("apply on a deleted key after a throttle = %v, want precondition 0 failed", err)
	}
	if got := fmt.Sprint(r.sleeps.all()); got != "[7.5ms 15ms 7.5ms 15ms 7.5ms]" {
		t.Fatalf("back-offs %s", got)
	}
	if st := r.store.Stats(); st.DeleteItem != 8 || st.Throttled != 6 || st.SingleWrites != 2 || st.ConditionFailed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A precondition-only batch on one key is a read: a lost or refused
// GetItem is retried, never ambiguous, and writes nothing.
func TestSingleCheckRetried(t *testing.T) {
	r := newOpFaultRig(t, "GetItem", 3)
	ctx := t.Context()
	check := relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "k", Absent: true}}}
	r.rt.then(drop, throttle)
	if err := r.store.Apply(ctx, "p", check); err != nil {
		t.Fatalf("check after a lost response and a throttle: %v", err)
	}
	r.rt.then(fail500, fail500, fail500)
	err := r.store.Apply(ctx, "p", check)
	if !errors.Is(err, dynamo.ErrRetriesExhausted) || relaycore.MayBeApplied(err) {
		t.Fatalf("check failing on every attempt = %v, want retries exhausted, surely not applied", err)
	}
	if st := r.store.Stats(); st.GetItem != 6 || st.Checks != 1 || st.WriteUnits != 0 || st.TransactWriteItems != 0 {
		t.Fatalf("stats %+v", st)
	}
}
