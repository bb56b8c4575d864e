package bolt

import (
	"path/filepath"
	"testing"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/storetest"
)

// openTemp opens a fresh file in t.TempDir and, when the test ends, checks
// the file with bbolt's consistency check before closing it.
func openTemp(t testing.TB, opts Options) *DB {
	t.Helper()
	db, err := Open(filepath.Join(t.TempDir(), "relay.db"), opts)
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

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) relaycore.Store {
		return openTemp(t, Options{}).Store("relay")
	})
}

// TestConformanceSharedFile runs the suite on one table of a file whose
// other table is busy with its own keys, partitions and due entries: the
// suite's exact Scan and Due expectations fail if tables mix.
func TestConformanceSharedFile(t *testing.T) {
	storetest.Run(t, func(t *testing.T) relaycore.Store {
		db := openTemp(t, Options{})
		other := db.Store("source")
		for _, p := range []relaycore.Partition{"p", "p1", "a", "cas", "m1"} {
			err := other.Apply(t.Context(), p, relaycore.Batch{Writes: []relaycore.Write{
				{Key: "a", Value: []byte("other table")},
				{Key: "k0", Value: []byte("other table"), Due: 1},
				{Key: "zz", Value: []byte("other table"), Due: 50},
			}})
			if err != nil {
				t.Fatal(err)
			}
		}
		return db.Store("target")
	})
}

// TestConformanceRaisedLimits proves the limit tests follow the store's
// reported capabilities rather than DynamoDB's constants.
func TestConformanceRaisedLimits(t *testing.T) {
	storetest.Run(t, func(t *testing.T) relaycore.Store {
		return openTemp(t, Options{Capabilities: relaycore.Capabilities{
			MaxBatchItems: 150, MaxBatchBytes: 1 << 20, MaxItemBytes: 600 << 10, ItemOverhead: 8,
		}}).Store("relay")
	})
}
