package relay

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
)

// roomFixture is a sender whose store stamps received times from a clock
// the test sets, and whose ledger the test drives by hand (no workers
// run), so which segments MakeRoom picks depends on nothing else.
func roomFixture(t *testing.T, cond ledger.Condition) (*Executor, *node, func(id string, at time.Time, acks ...string)) {
	t.Helper()
	f := newFixture(t, ack, ack)
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "edged.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	led, err := ledger.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	var now time.Time
	st, err := segstore.Open(dir, db, segstore.Options{QuotaBytes: 1 << 20, QuotaSegments: 100, MaxSegmentBytes: 1 << 20,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	f.a = &node{db: db, led: led, store: st, dir: dir}
	ex := f.executor(t, func(c *Config) { c.Condition = cond })
	add := func(id string, at time.Time, acks ...string) {
		t.Helper()
		now = at
		if err := ex.Schedule(f.a.put(t, id, []byte("content of "+id))); err != nil {
			t.Fatal(err)
		}
		for _, p := range acks {
			if _, ok, err := led.TryTransitionInflight(id, p, at); !ok || err != nil {
				t.Fatalf("claim %s/%s: %v", id, p, err)
			}
			if _, err := led.TransitionAcked(id, p, at); err != nil {
				t.Fatal(err)
			}
		}
		ex.checkSuccessCondition(id)
	}
	return ex, f.a, add
}

func ids(ev []Evicted) []string {
	var out []string
	for _, e := range ev {
		out = append(out, e.ID)
	}
	return out
}

func stored(t *testing.T, n *node) []string {
	t.Helper()
	es, err := n.store.List()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

// TestMakeRoomOldestRelayedFirst: MakeRoom evicts relayed segments in
// received order (not id order), only as many as asked for, and never one
// whose success condition is unmet, however much is asked.
func TestMakeRoomOldestRelayedFirst(t *testing.T) {
	ex, n, add := roomFixture(t, ledger.AllPeers)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	add("owed", t0, "b") // the oldest, but c has not acknowledged it
	add("z-old", t0.Add(time.Minute), "b", "c")
	add("m-mid", t0.Add(2*time.Minute), "b", "c")
	add("a-new", t0.Add(3*time.Minute), "b", "c")
	size := int64(len("content of z-old"))

	if got := ids(ex.MakeRoom(1, 0)); !slices.Equal(got, []string{"z-old"}) {
		t.Fatalf("MakeRoom(1 byte) evicted %v, want [z-old]", got)
	}
	if got := ids(ex.MakeRoom(size, 2)); !slices.Equal(got, []string{"m-mid", "a-new"}) {
		t.Fatalf("MakeRoom(2 segments) evicted %v", got)
	}
	if got := ex.MakeRoom(1<<30, 100); len(got) != 0 {
		t.Fatalf("evicted an owed segment: %v", got)
	}
	if got := stored(t, n); !slices.Equal(got, []string{"owed"}) {
		t.Fatalf("stored %v", got)
	}
}

// TestMakeRoomWaitsForOwedPeers: under one_peer a segment is relayed once
// b acknowledged it, but while c's delivery is pending it is still owed
// and MakeRoom leaves it; once c's record is settled (deadlettered) it
// may go.
func TestMakeRoomWaitsForOwedPeers(t *testing.T) {
	ex, n, add := roomFixture(t, ledger.OnePeer)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	add("s", t0, "b")
	if e, err := n.store.Stat("s"); err != nil || !e.Relayed {
		t.Fatalf("s not relayed: %+v %v", e, err)
	}
	if got := ex.MakeRoom(1, 1); len(got) != 0 {
		t.Fatalf("evicted %v while c is owed", got)
	}
	if _, _, err := n.led.TryTransitionInflight("s", "c", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := n.led.TransitionFailed("s", "c", errors.New("down"), t0, ledger.Policy{MaxRetries: 1, Initial: time.Second, Max: time.Second}); err != nil {
		t.Fatal(err)
	}
	if got := ids(ex.MakeRoom(1, 1)); !slices.Equal(got, []string{"s"}) {
		t.Fatalf("evicted %v after c deadlettered", got)
	}
}
