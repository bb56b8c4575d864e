package segstore

import (
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestUpdateRelayed: the markers cleared and set and the caller's own
// write commit together, or not at all when the caller's write fails;
// ids not stored, or whose marker is as asked already, are skipped.
func TestUpdateRelayed(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	opt := testOpts
	opt.Now = func() time.Time { return now }
	f := newStore(t, "", opt)
	for _, id := range []string{"marked", "plain", "plain-2"} {
		put(t, f.s, id, []byte(id))
	}
	if _, err := f.s.MarkRelayedAll([]string{"marked"}); err != nil {
		t.Fatal(err)
	}
	relayed := func() map[string]bool {
		out := map[string]bool{}
		for _, id := range []string{"marked", "plain", "plain-2"} {
			e, err := f.s.Stat(id)
			if err != nil {
				t.Fatal(err)
			}
			out[id] = e.Relayed
		}
		return out
	}
	other := []byte("other")
	boom := errors.New("the caller's write failed")
	_, _, err := f.s.UpdateRelayed([]string{"marked"}, []string{"plain"}, func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucket(other); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("UpdateRelayed = %v, want the caller's error", err)
	}
	if got := relayed(); !got["marked"] || got["plain"] {
		t.Fatalf("a failed update changed markers: %v", got)
	}
	now = now.Add(time.Hour)
	cleared, marked, err := f.s.UpdateRelayed([]string{"plain-2", "marked", "nope"}, []string{"plain", "marked-not-stored"}, func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket(other)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cleared) != 1 || cleared[0].ID != "marked" || cleared[0].Relayed || len(marked) != 1 || marked[0].ID != "plain" || !marked[0].RelayedAt.Equal(now) {
		t.Fatalf("cleared %+v, marked %+v; want marked cleared and plain marked at %v", cleared, marked, now)
	}
	if got := relayed(); got["marked"] || !got["plain"] || got["plain-2"] {
		t.Fatalf("markers after the update: %v", got)
	}
	if err := f.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(other) == nil {
			return errors.New("the caller's write was not committed")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
