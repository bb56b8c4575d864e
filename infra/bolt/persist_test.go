package bolt

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/relaycore"
	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// state reads everything the contract exposes for the given partitions:
// every item and the whole due index.
func state(t *testing.T, s *Store, parts ...relaycore.Partition) string {
	t.Helper()
	var b strings.Builder
	for _, p := range parts {
		page, err := s.Scan(t.Context(), p, relaycore.ScanRequest{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s: %q\n", p, page.Items)
	}
	due, err := s.Due(t.Context(), math.MaxInt64, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "due: %v\n", due)
	return b.String()
}

func TestReopenKeepsState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	src, dst := db.Store("source"), db.Store("target")
	batches := []struct {
		s *Store
		p relaycore.Partition
		b relaycore.Batch
	}{
		{src, "s1", relaycore.Batch{Writes: []relaycore.Write{
			{Key: "os", Value: []byte("7")}, {Key: "alarm", Value: []byte("a"), Due: 1_764_000_000_000},
			{Key: "row/1", Value: []byte{}}, {Key: "row/2", Value: []byte("r2")},
		}}},
		{src, "s1", relaycore.Batch{
			Preconditions: []relaycore.Precondition{{Key: "os", Value: []byte("7")}},
			Writes:        []relaycore.Write{{Key: "os", Value: []byte("8")}, {Key: "row/1", Delete: true}},
		}},
		{src, "s2", relaycore.Batch{Writes: []relaycore.Write{{Key: "alarm", Value: []byte("b"), Due: 5}}}},
		{dst, "t1", relaycore.Batch{Writes: []relaycore.Write{{Key: "rh/s1", Value: []byte("2")}, {Key: "user", Value: []byte{0, 0xff}}}}},
	}
	for _, b := range batches {
		if err := b.s.Apply(t.Context(), b.p, b.b); err != nil {
			t.Fatal(err)
		}
	}
	wantSrc, wantDst := state(t, src, "s1", "s2"), state(t, dst, "t1")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openPath(t, path, Options{})
	if got := state(t, db.Store("source"), "s1", "s2"); got != wantSrc {
		t.Fatalf("source after reopen:\n%s\nwant\n%s", got, wantSrc)
	}
	if got := state(t, db.Store("target"), "t1"); got != wantDst {
		t.Fatalf("target after reopen:\n%s\nwant\n%s", got, wantDst)
	}
	if !strings.Contains(wantSrc, `{"os" "8"}`) || !strings.Contains(wantSrc, "{s2 alarm 5}") {
		t.Fatalf("unexpected source state before reopen:\n%s", wantSrc)
	}
}

// openPath opens an existing path and checks and closes it after the test.
func openPath(t *testing.T, path string, opts Options) *DB {
	t.Helper()
	db, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Check(); err != nil {
			t.Errorf("after the test: %v", err)
		}
		if err := checkLayout(db); err != nil {
			t.Errorf("after the test: %v", err)
		}
		if err := db.Close(); err != nil {
			t.Errorf("after the test: %v", err)
		}
	})
	return db
}

func TestSecondOpenTimesOut(t *testing.T) {
	db := openTemp(t, Options{})
	_, err := Open(db.Path(), Options{LockTimeout: 20 * time.Millisecond})
	if !errors.Is(err, berrors.ErrTimeout) {
		t.Fatalf("second open = %v, want bbolt's lock timeout", err)
	}
}

func TestEmptyTableName(t *testing.T) {
	s := openTemp(t, Options{}).Store("")
	ctx := t.Context()
	if _, _, err := s.Get(ctx, "p", "k"); !errors.Is(err, ErrInvalidTable) {
		t.Fatalf("get = %v, want ErrInvalidTable", err)
	}
	if _, err := s.Scan(ctx, "p", relaycore.ScanRequest{}); !errors.Is(err, ErrInvalidTable) {
		t.Fatalf("scan = %v, want ErrInvalidTable", err)
	}
	err := s.Apply(ctx, "p", relaycore.Batch{Writes: []relaycore.Write{{Key: "k"}}})
	if !errors.Is(err, ErrInvalidTable) || relaycore.MayBeApplied(err) {
		t.Fatalf("apply = %v, want ErrInvalidTable, surely not applied", err)
	}
	if _, err := s.Due(ctx, 0, 1); !errors.Is(err, ErrInvalidTable) {
		t.Fatalf("due = %v, want ErrInvalidTable", err)
	}
}

func TestClosedDB(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "relay.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := db.Store("relay")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	err = s.Apply(t.Context(), "p", relaycore.Batch{Writes: []relaycore.Write{{Key: "k"}}})
	if !errors.Is(err, berrors.ErrDatabaseNotOpen) || relaycore.MayBeApplied(err) {
		t.Fatalf("apply on a closed DB = %v; want ErrDatabaseNotOpen, surely not applied", err)
	}
	if _, _, err := s.Get(t.Context(), "p", "k"); err == nil {
		t.Fatal("get on a closed DB succeeded")
	}
}

func TestKeyLengthLimit(t *testing.T) {
	s := openTemp(t, Options{}).Store("relay")
	p := relaycore.Partition(strings.Repeat("p", relaycore.MaxPartitionLen))
	longest := strings.Repeat("k", MaxKeyLen)
	// The longest key, in the longest partition, with a due entry: the
	// due-index key is exactly bbolt's limit.
	if err := s.Apply(t.Context(), p, relaycore.Batch{Writes: []relaycore.Write{{Key: longest, Value: []byte("v"), Due: 9}}}); err != nil {
		t.Fatal(err)
	}
	due, err := s.Due(t.Context(), 9, 1)
	if err != nil || len(due) != 1 || due[0].Key != longest || due[0].Partition != p {
		t.Fatalf("due = %d entries, %v; want the longest key", len(due), err)
	}
	err = s.Apply(t.Context(), p, relaycore.Batch{Writes: []relaycore.Write{{Key: longest + "k", Value: []byte("v")}}})
	if !errors.Is(err, relaycore.ErrInvalidBatch) || relaycore.MayBeApplied(err) {
		t.Fatalf("apply of a key over MaxKeyLen = %v; want ErrInvalidBatch", err)
	}
	if bbolt.MaxKeySize != MaxKeyLen+dueKeyPrefix+relaycore.MaxPartitionLen {
		t.Fatal("MaxKeyLen no longer matches bbolt's key limit")
	}
}
