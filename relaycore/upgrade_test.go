package relaycore_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/relaycore"
)

// The upgrade fixture is a source and its targets as the engine of
// commit c9b6904 (per-target records t/<hex>/e and t/<hex>/s) left them,
// once in a bbolt file and once as a DynamoDB table dump, with targets in
// every state an operator meets: rows pending to several targets, an idle
// target with everything delivered, a
// quarantined target with held rows, a paused one, one with a skipped range
// in the archive, one blocked with a last error, and a target whose rows
// no fire has seen yet. TestUpgradeFixture delivers from both and operates
// on them with today's engine; -write-upgrade-fixture regenerates them (only
// meaningful on the layout the fixture stands for).
var flagWriteUpgrade = flag.Bool("write-upgrade-fixture", false, "regenerate testdata/upgrade from the engine of this tree")

const (
	upgradeDir    = "testdata/upgrade"
	upgradeSource = relaycore.Partition("src-upgrade")
)

// upgradeExpect is what the fixture's engine reported about its own
// records, and what delivering everything must leave in the targets.
type upgradeExpect struct {
	NowMS    int64                    `json:"now_ms"`
	Targets  []relaycore.TargetStatus `json:"targets"`
	Hold     relaycore.HoldSummary    `json:"hold"`
	Keys     map[string]string        `json:"keys"`    // target + "\x00" + key -> value, after delivery
	Skipped  []string                 `json:"skipped"` // target + "\x00" + key, never delivered
	Archived int                      `json:"archived"`
}

// downStore refuses every target batch to the partitions in down.
type downStore struct {
	relaycore.Store
	down map[relaycore.Partition]bool
}

var errTargetDown = errors.New("injected: target down")

func (d *downStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if d.down[p] {
		return errTargetDown
	}
	return d.Store.Apply(ctx, p, b)
}

// upgradeRows are n rows for target, numbered from i: each puts
// <target>/<nnn> = v<nnn>, and expect records them.
func upgradeRows(x *upgradeExpect, target relaycore.Partition, i, n int) []relaycore.Row {
	var out []relaycore.Row
	for j := i; j < i+n; j++ {
		k, v := fmt.Sprintf("%s/%03d", target, j), fmt.Sprintf("v%03d", j)
		out = append(out, put(target, k, v))
		if x != nil {
			x.Keys[string(target)+"\x00"+k] = v
		}
	}
	return out
}

// buildUpgradeFixture drives the engine into the fixture's states.
func buildUpgradeFixture(t *testing.T, src, tgt relaycore.Store) upgradeExpect {
	ctx := context.Background()
	clock := newTestClock()
	x := upgradeExpect{Keys: map[string]string{}}
	down := &downStore{Store: tgt, down: map[relaycore.Partition]bool{"quar": true, "skip": true, "blocked": true}}
	h := &relaycore.RelayHandler{Source: src, Target: down, Clock: clock, QuarantineAfter: 50}
	h.Budget, _ = relaycore.PlanBudget("paid")
	enqueue := func(rows ...[]relaycore.Row) {
		t.Helper()
		clock.Advance(time.Second)
		if _, err := h.Enqueue(ctx, upgradeSource, slices.Concat(rows...), relaycore.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	alarm := func() {
		t.Helper()
		clock.Advance(10 * time.Second)
		if _, err := h.Alarm(ctx, upgradeSource); err != nil {
			t.Fatal(err)
		}
	}
	who := relaycore.Actor{By: "alice", Reason: "upgrade fixture"}
	enqueue(upgradeRows(&x, "ok-a", 0, 5), upgradeRows(&x, "ok-b", 0, 3), upgradeRows(&x, "quar", 0, 3),
		upgradeRows(&x, "paused", 0, 3), upgradeRows(&x, "skip", 0, 4), upgradeRows(&x, "blocked", 0, 2))
	alarm() // ok-a, ok-b, paused delivered; quar, skip, blocked fail
	for i := range 3 {
		enqueue(upgradeRows(&x, "ok-a", 5+2*i, 2), upgradeRows(&x, "paused", 3+i, 1), upgradeRows(&x, "quar", 3+i, 1),
			upgradeRows(&x, "skip", 4+i, 1))
	}
	enqueue(upgradeRows(&x, "ok-b", 3, 2), upgradeRows(&x, "blocked", 2, 1))
	for _, op := range []struct {
		fn     func(context.Context, relaycore.Partition, relaycore.Partition, relaycore.Actor) (relaycore.TargetStatus, error)
		target relaycore.Partition
	}{{h.Quarantine, "quar"}, {h.Quarantine, "skip"}, {h.Pause, "paused"}} {
		clock.Advance(time.Second)
		if _, err := op.fn(ctx, upgradeSource, op.target, who); err != nil {
			t.Fatalf("%s: %v", op.target, err)
		}
	}
	st, err := relaycore.GetTarget(ctx, src, upgradeSource, "skip")
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	res, err := h.Skip(ctx, upgradeSource, relaycore.SkipRequest{Target: "skip", ExpectFirst: st.HeldFirst, Through: st.HeldFirst + 1,
		Actor: relaycore.Actor{By: "bob", Reason: "poison rows"}})
	if err != nil {
		t.Fatal(err)
	}
	x.Archived = res.Rows
	v, err := relaycore.InspectSource(ctx, src, upgradeSource)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range v.Archive {
		for _, r := range e.Rows {
			for _, kv := range r.Puts {
				delete(x.Keys, string(r.Target)+"\x00"+kv.Key)
				x.Skipped = append(x.Skipped, string(r.Target)+"\x00"+kv.Key)
			}
		}
	}
	alarm() // blocked fails again; the held targets hold their new rows
	enqueue(upgradeRows(&x, "ok-a", 11, 3), upgradeRows(&x, "fresh", 0, 2), upgradeRows(&x, "quar", 6, 1))
	x.NowMS = clock.Now().UnixMilli()
	x.Targets, _, err = relaycore.ListTargets(ctx, src, upgradeSource, relaycore.TargetFilter{All: true}, clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if v, err = relaycore.InspectSource(ctx, src, upgradeSource); err != nil {
		t.Fatal(err)
	}
	x.Hold = v.Hold
	return x
}

// dynamoItem is one DynamoDB item of the dump, attributes as docs/
// dynamodb.md names them.
type dynamoItem struct {
	Table string `json:"table"`
	P     string `json:"p"`
	K     string `json:"k"`
	V     []byte `json:"v,omitempty"`
	Due   string `json:"due,omitempty"`
	DS    string `json:"ds,omitempty"`
}

func dumpDynamo(t *testing.T, client *dynamodb.Client, tables ...string) []dynamoItem {
	var out []dynamoItem
	for _, table := range tables {
		p := dynamodb.NewScanPaginator(client, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
		for p.HasMorePages() {
			pg, err := p.NextPage(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range pg.Items {
				d := dynamoItem{Table: table}
				for name, av := range it {
					switch a := av.(type) {
					case *types.AttributeValueMemberS:
						switch name {
						case "p":
							d.P = a.Value
						case "k":
							d.K = a.Value
						case "ds":
							d.DS = a.Value
						default:
							t.Fatalf("unexpected attribute %s", name)
						}
					case *types.AttributeValueMemberB:
						d.V = a.Value
					case *types.AttributeValueMemberN:
						d.Due = a.Value
					default:
						t.Fatalf("unexpected attribute %s", name)
					}
				}
				out = append(out, d)
			}
		}
	}
	slices.SortFunc(out, func(a, b dynamoItem) int {
		if c := compareStrings(a.Table+"\x00"+a.P, b.Table+"\x00"+b.P); c != 0 {
			return c
		}
		return compareStrings(a.K, b.K)
	})
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// loadDynamo puts the dump's items through the real SDK, attribute for
// attribute.
func loadDynamo(t *testing.T, client *dynamodb.Client, items []dynamoItem) {
	for _, d := range items {
		it := map[string]types.AttributeValue{"p": &types.AttributeValueMemberS{Value: d.P}, "k": &types.AttributeValueMemberS{Value: d.K}}
		if len(d.V) > 0 {
			it["v"] = &types.AttributeValueMemberB{Value: d.V}
		}
		if d.Due != "" {
			it["due"] = &types.AttributeValueMemberN{Value: d.Due}
			it["ds"] = &types.AttributeValueMemberS{Value: d.DS}
		}
		if _, err := client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(d.Table), Item: it}); err != nil {
			t.Fatal(err)
		}
	}
}

func writeJSON(t *testing.T, path string, v any) {
	raw, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readJSON(t *testing.T, path string, v any) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func writeUpgradeFixture(t *testing.T) {
	if err := os.MkdirAll(upgradeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(upgradeDir, "relay.db")
	_ = os.Remove(path)
	db, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	xb := buildUpgradeFixture(t, db.Store("source"), db.Store("target"))
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(upgradeDir, "bolt-expect.json"), xb)

	e := dynamotest.Start(t)
	client := e.Client(nil)
	for _, table := range []string{"source", "target"} {
		if err := dynamo.CreateTable(context.Background(), client, table); err != nil {
			t.Fatal(err)
		}
	}
	opts := dynamo.Options{DueMode: dynamo.DueScan}
	xd := buildUpgradeFixture(t, dynamo.New(client, "source", opts), dynamo.New(client, "target", opts))
	writeJSON(t, filepath.Join(upgradeDir, "dynamo-expect.json"), xd)
	writeJSON(t, filepath.Join(upgradeDir, "dynamo-items.json"), dumpDynamo(t, client, "source", "target"))
}

// TestUpgradeFixture opens the fixture's bbolt file and loads its DynamoDB
// dump, checks that today's engine reads the same figures the old one
// reported, then enqueues more, releases, resumes and delivers everything,
// and checks every target key and every record.
func TestUpgradeFixture(t *testing.T) {
	if *flagWriteUpgrade {
		writeUpgradeFixture(t)
	}
	t.Run("bolt", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(upgradeDir, "relay.db"))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "relay.db")
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(path, bolt.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		var x upgradeExpect
		readJSON(t, filepath.Join(upgradeDir, "bolt-expect.json"), &x)
		checkUpgrade(t, db.Store("source"), db.Store("target"), x)
	})
	t.Run("dynamodb", func(t *testing.T) {
		e := dynamotest.Start(t)
		client := e.Client(nil)
		for _, table := range []string{"source", "target"} {
			if err := dynamo.CreateTable(context.Background(), client, table); err != nil {
				t.Fatal(err)
			}
		}
		var items []dynamoItem
		readJSON(t, filepath.Join(upgradeDir, "dynamo-items.json"), &items)
		loadDynamo(t, client, items)
		var x upgradeExpect
		readJSON(t, filepath.Join(upgradeDir, "dynamo-expect.json"), &x)
		opts := dynamo.Options{DueMode: dynamo.DueScan}
		checkUpgrade(t, dynamo.New(client, "source", opts), dynamo.New(client, "target", opts), x)
	})
}

// upgradeFigures are the fields of a TargetStatus the upgrade keeps.
func upgradeFigures(s relaycore.TargetStatus) relaycore.TargetStatus {
	return relaycore.TargetStatus{Target: s.Target, State: s.State, SinceMS: s.SinceMS, Pending: s.Pending, Held: s.Held,
		FirstSeq: s.FirstSeq, OldestMS: s.OldestMS, Enqueued: s.Enqueued, Done: s.Done, Skipped: s.Skipped,
		HeldFirst: s.HeldFirst, HeldLast: s.HeldLast, FailedAttempts: s.FailedAttempts, FailedRounds: s.FailedRounds,
		LastError: s.LastError, Note: s.Note, RetryMS: s.RetryMS, Released: s.Released, Exact: s.Exact}
}

// checkRecordsAgree checks that each target's pending count is the rows
// the outbox and the held pages hold for it.
func checkRecordsAgree(t *testing.T, st relaycore.Store, now time.Time) []relaycore.TargetStatus {
	t.Helper()
	ctx := context.Background()
	v, err := relaycore.InspectSource(ctx, st, upgradeSource)
	if err != nil {
		t.Fatal(err)
	}
	queued := map[relaycore.Partition]uint64{}
	for _, r := range v.Rows() {
		queued[r.Target]++
	}
	ts, _, err := relaycore.ListTargets(ctx, st, upgradeSource, relaycore.TargetFilter{All: true}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ts {
		if s.Pending != queued[s.Target] {
			t.Errorf("target %s: %d pending, the outbox and held pages hold %d", s.Target, s.Pending, queued[s.Target])
		}
		delete(queued, s.Target)
	}
	for tg, n := range queued {
		t.Errorf("target %s: %d rows queued and no record", tg, n)
	}
	return ts
}

func checkUpgrade(t *testing.T, src, tgt relaycore.Store, x upgradeExpect) {
	ctx := context.Background()
	clock := newTestClock()
	clock.Set(time.UnixMilli(x.NowMS))
	h := &relaycore.RelayHandler{Source: src, Target: tgt, Clock: clock}
	h.Budget, _ = relaycore.PlanBudget("paid")

	// The records read as the old engine reported them.
	ts := checkRecordsAgree(t, src, clock.Now())
	if len(ts) != len(x.Targets) {
		t.Fatalf("%d targets listed, the fixture's engine listed %d", len(ts), len(x.Targets))
	}
	for i := range ts {
		got, _ := json.Marshal(upgradeFigures(ts[i]))
		want, _ := json.Marshal(upgradeFigures(x.Targets[i]))
		if string(got) != string(want) {
			t.Errorf("target %s:\n got %s\nwant %s", x.Targets[i].Target, got, want)
		}
	}
	for _, w := range x.Targets {
		g, err := relaycore.GetTarget(ctx, src, upgradeSource, w.Target)
		if err != nil || g.Pending != w.Pending || g.State != w.State || g.Held != w.Held {
			t.Errorf("GetTarget %s: %+v, %v; listed %+v", w.Target, g, err, w)
		}
	}
	def, _, err := relaycore.ListTargets(ctx, src, upgradeSource, relaycore.TargetFilter{}, clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	var names []relaycore.Partition
	for _, s := range def {
		names = append(names, s.Target)
	}
	if want := []relaycore.Partition{"blocked", "fresh", "ok-a", "paused", "quar", "skip"}; !slices.Equal(names, want) {
		t.Errorf("default listing %q, want %q", names, want)
	}

	// Operate on it: more rows, then every held target back to active.
	clock.Advance(time.Second)
	if _, err := h.Enqueue(ctx, upgradeSource, slices.Concat(upgradeRows(&x, "ok-a", 14, 2), upgradeRows(&x, "fresh", 2, 1),
		upgradeRows(&x, "quar", 7, 1), upgradeRows(&x, "new", 0, 2)), relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	checkRecordsAgree(t, src, clock.Now())
	who := relaycore.Actor{By: "carol", Reason: "upgraded"}
	for _, op := range []struct {
		fn     func(context.Context, relaycore.Partition, relaycore.Partition, relaycore.Actor) (relaycore.TargetStatus, error)
		target relaycore.Partition
	}{{h.Release, "quar"}, {h.Release, "skip"}, {h.Resume, "paused"}} {
		clock.Advance(time.Second)
		if _, err := op.fn(ctx, upgradeSource, op.target, who); err != nil {
			t.Fatalf("%s: %v", op.target, err)
		}
	}
	for i := 0; ; i++ {
		v, err := relaycore.InspectSource(ctx, src, upgradeSource)
		if err != nil {
			t.Fatal(err)
		}
		if v.Alarm == nil {
			break
		}
		if i > 100 {
			t.Fatalf("not drained after %d alarms: %d rows left", i, len(v.Rows()))
		}
		clock.Set(time.UnixMilli(max(v.Alarm.DueMS, clock.Now().UnixMilli())))
		if _, err := h.Alarm(ctx, upgradeSource); err != nil {
			t.Fatal(err)
		}
	}

	// Everything delivered, in the target partitions and in the records.
	for _, k := range slices.Sorted(maps.Keys(x.Keys)) {
		tg, key := splitUpgradeKey(k)
		v, ok, err := tgt.Get(ctx, tg, key)
		if err != nil || !ok || string(v) != x.Keys[k] {
			t.Errorf("target %s key %s = %q %v %v, want %q", tg, key, v, ok, err, x.Keys[k])
		}
	}
	for _, k := range x.Skipped {
		tg, key := splitUpgradeKey(k)
		if v, ok, _ := tgt.Get(ctx, tg, key); ok {
			t.Errorf("skipped row delivered: target %s key %s = %q", tg, key, v)
		}
	}
	ts = checkRecordsAgree(t, src, clock.Now())
	for _, s := range ts {
		if s.Pending != 0 || s.Held != 0 || s.State != relaycore.StateActive || s.Done != s.Enqueued {
			t.Errorf("target %s after delivery: %+v", s.Target, s)
		}
	}
	v, err := relaycore.InspectSource(ctx, src, upgradeSource)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Pages) != 0 || len(v.Held) != 0 || len(v.Retries) != 0 || v.Hold.HeldRows != 0 || v.Hold.Quarantined != 0 ||
		v.Hold.Paused != 0 || int(v.Hold.Archived) != x.Archived || len(v.Other) != 0 {
		t.Errorf("after delivery: %d pages, %d held, %d markers, q %+v, other %q", len(v.Pages), len(v.Held), len(v.Retries), v.Hold, v.Other)
	}
}

func splitUpgradeKey(k string) (relaycore.Partition, string) {
	for i := range len(k) {
		if k[i] == 0 {
			return relaycore.Partition(k[:i]), k[i+1:]
		}
	}
	return "", k
}
