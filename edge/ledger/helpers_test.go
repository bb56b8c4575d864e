package ledger

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// t0 is the fixed clock origin of every ledger test: the ledger never
// reads the clock, so tests pass times explicitly.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var testPolicy = Policy{MaxRetries: 3, Initial: time.Second, Max: 8 * time.Second}

type fixture struct {
	db *bolt.DB
	l  *Ledger
}

// newLedger opens a ledger on a real bbolt file in t.TempDir(). At cleanup
// it checks bbolt's own consistency and the pending-index invariant, so
// every test also proves the index stayed in step.
func newLedger(t *testing.T, opts *bolt.Options) *fixture {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "edged.db"), 0o600, opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		checkInvariants(t, db)
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return &fixture{db: db, l: l}
}

// checkInvariants: the pending bucket holds exactly one key per Scheduled
// or Failed record, derived from its NextAttemptAfter, and nothing else;
// Attempts ≥ BudgetBase ≥ 0; bbolt's page check passes.
func checkInvariants(t *testing.T, db *bolt.DB) {
	t.Helper()
	err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			t.Errorf("bbolt check: %v", err)
		}
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		want := map[string]bool{}
		err = b.records.ForEach(func(k, v []byte) error {
			r, err := decode(k, v)
			if err != nil {
				return err
			}
			if r.BudgetBase < 0 || r.Attempts < r.BudgetBase {
				t.Errorf("record %s/%s: attempts %d, budget base %d", r.SegmentID, r.PeerID, r.Attempts, r.BudgetBase)
			}
			if r.State.pending() {
				want[string(pendKey(r.NextAttemptAfter, r.SegmentID, r.PeerID))] = true
			} else if !r.NextAttemptAfter.IsZero() || !r.DeferredFrom.IsZero() {
				t.Errorf("record %s/%s in %s has NextAttemptAfter %v, DeferredFrom %v", r.SegmentID, r.PeerID, r.State, r.NextAttemptAfter, r.DeferredFrom)
			}
			if r.DeferredFrom.After(r.NextAttemptAfter) {
				t.Errorf("record %s/%s deferred from %v to the earlier %v", r.SegmentID, r.PeerID, r.DeferredFrom, r.NextAttemptAfter)
			}
			return nil
		})
		if err != nil {
			return err
		}
		n := 0
		err = b.pending.ForEach(func(k, v []byte) error {
			n++
			if !want[string(k)] {
				t.Errorf("stray pending key %q", k)
			}
			if len(v) != 0 {
				t.Errorf("pending key %q has a value", k)
			}
			return nil
		})
		if n != len(want) {
			t.Errorf("pending index has %d keys, want %d", n, len(want))
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
}

func rawRecord(t *testing.T, db *bolt.DB, seg, peer string) []byte {
	t.Helper()
	var out []byte
	if err := db.View(func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err == nil {
			out = bytes.Clone(b.records.Get(recKey(seg, peer)))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// commits is the number of write transactions committed on db so far
// (bbolt's transaction id counts them): each costs two fsyncs unless the
// database was opened NoSync.
func commits(t *testing.T, db *bolt.DB) int {
	t.Helper()
	var id int
	if err := db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	return id
}

// heldBy is a Held that asks exists about each segment.
func heldBy(exists func(segmentID string) bool) Held {
	return func(segs []string) ([]bool, error) {
		held := make([]bool, len(segs))
		for i, s := range segs {
			held[i] = exists(s)
		}
		return held, nil
	}
}
