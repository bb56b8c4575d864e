package ledger

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestEnsureScheduledAllOneCommit: scheduling many segments is one write
// transaction, whatever their number, and none when every record exists;
// existing records are kept as they are.
func TestEnsureScheduledAllOneCommit(t *testing.T) {
	f := newLedger(t, nil)
	must[[]string](t)(f.l.EnsureScheduled("s0003", []string{"q"}, t0))
	mustInflight(t, f.l, "s0003", "q", t0)
	must[Record](t)(f.l.TransitionAcked("s0003", "q", t0))
	owed := make([]Owed, 1000)
	for i := range owed {
		owed[i] = Owed{SegmentID: fmt.Sprintf("s%04d", i), PeerIDs: []string{"p", "q"}}
	}
	now := t0.Add(time.Minute)
	before := commits(t, f.db)
	created := must[[]Pair](t)(f.l.EnsureScheduledAll(owed, now))
	if got := commits(t, f.db) - before; got != 1 {
		t.Fatalf("scheduling 1000 segments committed %d transactions, want 1", got)
	}
	if len(created) != 1999 || created[0] != (Pair{"s0000", "p"}) || created[len(created)-1] != (Pair{"s0999", "q"}) {
		t.Fatalf("created %d pairs (%v … %v), want 1999 in the order given", len(created), created[0], created[len(created)-1])
	}
	if r := must[Record](t)(f.l.Get("s0003", "q")); r.State != StateAcked {
		t.Fatalf("existing record overwritten: %+v", r)
	}
	if r := must[Record](t)(f.l.Get("s0999", "p")); r.State != StateScheduled || !r.NextAttemptAfter.Equal(now) {
		t.Fatalf("new record %+v, want scheduled at %v", r, now)
	}
	before = commits(t, f.db)
	if again := must[[]Pair](t)(f.l.EnsureScheduledAll(owed, now.Add(time.Minute))); len(again) != 0 {
		t.Fatalf("second call created %v", again)
	}
	if got := commits(t, f.db) - before; got != 0 {
		t.Fatalf("nothing to schedule, yet %d transactions committed", got)
	}
	if _, err := f.l.EnsureScheduledAll([]Owed{{SegmentID: "ok", PeerIDs: []string{"p"}}, {SegmentID: "bad\x00id", PeerIDs: []string{"p"}}}, now); err == nil {
		t.Fatal("invalid id accepted")
	}
	if _, err := f.l.Get("ok", "p"); err == nil {
		t.Fatal("a batch with an invalid id wrote part of itself")
	}
}

// TestStandingAll: one read transaction answers each segment's Assurance
// (as Assurance does, one read each) and the required peers it has no
// record for; EnsureScheduledIn then writes exactly those records inside
// the caller's transaction, and rolls back with it.
func TestStandingAll(t *testing.T) {
	f := newLedger(t, nil)
	must[[]string](t)(f.l.EnsureScheduled("acked", []string{"p", "q"}, t0))
	for _, p := range []string{"p", "q"} {
		mustInflight(t, f.l, "acked", p, t0)
		must[Record](t)(f.l.TransitionAcked("acked", p, t0))
	}
	must[[]string](t)(f.l.EnsureScheduled("half", []string{"p"}, t0))
	mustInflight(t, f.l, "half", "p", t0)
	must[Record](t)(f.l.TransitionAcked("half", "p", t0))
	owed := []Owed{
		{SegmentID: "acked", PeerIDs: []string{"p", "q"}},
		{SegmentID: "half", PeerIDs: []string{"p", "q", "q"}}, // q twice: owed once
		{SegmentID: "none", PeerIDs: []string{"q", "p"}},
	}
	for _, c := range []Condition{AllPeers, OnePeer} {
		before := f.db.Stats().TxN
		got := must[[]Standing](t)(f.l.StandingAll(owed, c))
		if n := f.db.Stats().TxN - before; n != 1 {
			t.Errorf("%s: %d read transactions, want 1", c, n)
		}
		for i, o := range owed {
			a := must[Assurance](t)(f.l.Assurance(o.SegmentID, o.PeerIDs, c))
			if !slices.Equal(got[i].AckedPeers, a.AckedPeers) || got[i].Met != a.Met {
				t.Errorf("%s %s: standing %+v, Assurance %+v", c, o.SegmentID, got[i].Assurance, a)
			}
		}
		if len(got[0].Unrecorded) != 0 || !slices.Equal(got[1].Unrecorded, []string{"q"}) || !slices.Equal(got[2].Unrecorded, []string{"q", "p"}) {
			t.Errorf("%s: unrecorded %v, %v, %v; want [], [q], [q p]", c, got[0].Unrecorded, got[1].Unrecorded, got[2].Unrecorded)
		}
	}
	if _, err := f.l.StandingAll([]Owed{{SegmentID: "s", PeerIDs: []string{"p"}}}, "most_peers"); !errors.Is(err, ErrUnknownCondition) {
		t.Fatalf("unknown condition: %v", err)
	}

	missing := []Owed{{SegmentID: "half", PeerIDs: []string{"q"}}, {SegmentID: "none", PeerIDs: []string{"q", "p"}}}
	boom := errors.New("the caller's other write failed")
	err := f.db.Update(func(tx *bolt.Tx) error {
		if _, err := f.l.EnsureScheduledIn(tx, missing, t0); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, err := f.l.Get("none", "q"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a rolled back transaction kept its records: %v", err)
	}
	var created []Pair
	if err := f.db.Update(func(tx *bolt.Tx) (err error) {
		created, err = f.l.EnsureScheduledIn(tx, append(missing, owed[0]), t0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if want := []Pair{{"half", "q"}, {"none", "q"}, {"none", "p"}}; !slices.Equal(created, want) {
		t.Fatalf("created %v, want %v", created, want)
	}
	for _, st := range must[[]Standing](t)(f.l.StandingAll(owed, AllPeers)) {
		if len(st.Unrecorded) != 0 {
			t.Fatalf("still unrecorded after EnsureScheduledIn: %+v", st)
		}
	}
}
