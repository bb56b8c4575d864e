package daemon

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/segstore"
)

// repairSegments are stored by newRepairNode before its database is damaged.
var repairSegments = map[string][]byte{
	"seg-1": bytes.Repeat([]byte("one "), 1000),
	"seg-2": bytes.Repeat([]byte("two "), 3000),
	"seg-3": bytes.Repeat([]byte("three "), 5000),
}

// newRepairNode returns the config of a node with one known peer (never
// dialled here) that has stored repairSegments and been closed.
func newRepairNode(t *testing.T, mods ...func(*config.Config)) *config.Config {
	t.Helper()
	dir := pkitest.New(t, "a", "b")
	cfg := nodeConfig(t, dir, "a", "127.0.0.1:7400", "127.0.0.1:7401", []config.Peer{{ID: "b", Address: "127.0.0.1:9"}})
	for _, m := range mods {
		m(cfg)
	}
	d, err := New(cfg, Options{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// seg-2, which the tests tear, goes last: in a pack it is then the
	// last record, and cutting the pack tears it alone.
	for _, id := range []string{"seg-1", "seg-3", "seg-2"} {
		b := repairSegments[id]
		if _, err := (backend{d}).Ingest(context.Background(), id, int64(len(b)), digest(b), bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func dbPath(cfg *config.Config) string { return filepath.Join(cfg.Storage.Dir, DBFile) }

// storageModes are the two ways a store keeps small segments: the
// repair tests run both.
var storageModes = []struct {
	name string
	mod  func(*config.Config)
}{
	{"files", func(c *config.Config) { c.Storage.PackMaxBytes = 0 }},
	{"packs", func(c *config.Config) { c.Storage.PackMaxBytes = config.DefaultPackMaxBytes }},
}

// segmentAt returns the file holding a closed node's segment id and the
// offset of its content there (segstore.Store.Where).
func segmentAt(t *testing.T, cfg *config.Config, id string) (string, int64) {
	t.Helper()
	db, err := bolt.Open(dbPath(cfg), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := segstore.Open(cfg.Storage.Dir, db, segstore.Options{QuotaBytes: 1 << 30, QuotaSegments: 100, MaxSegmentBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	path, off, err := s.Where(id)
	if err != nil {
		t.Fatal(err)
	}
	return path, off
}

// damages are ways a database file goes bad. Each must be set aside.
var damages = map[string]func(t *testing.T, path string){
	"truncated to a third": func(t *testing.T, path string) {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, fi.Size()/3); err != nil {
			t.Fatal(err)
		}
	},
	"truncated inside the meta pages": func(t *testing.T, path string) {
		if err := os.Truncate(path, 5000); err != nil {
			t.Fatal(err)
		}
	},
	"meta pages garbled": func(t *testing.T, path string) {
		overwrite(t, path, 0, 8192)
	},
	"data pages garbled": func(t *testing.T, path string) {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		overwrite(t, path, 8192, fi.Size()-8192)
	},
	"index entry undecodable": func(t *testing.T, path string) {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("edge.segments")).Put([]byte("seg-2"), []byte("{garbage"))
		}); err != nil {
			t.Fatal(err)
		}
	},
	"ledger record undecodable": func(t *testing.T, path string) {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("edge.ledger")).Bucket([]byte("records")).Put([]byte("seg-1\x00b"), []byte("]"))
		}); err != nil {
			t.Fatal(err)
		}
	},
}

// overwrite fills n bytes at off with a byte pattern that is no valid page.
func overwrite(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xA5, 0x5A, 0xFF, 0x01}, int(n/4)), off); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedDatabaseIsRepaired: whatever is wrong with edged.db, New
// sets the file aside (byte for byte), rebuilds the index from the
// segment files (digests from their tags, sources kept), re-derives the
// ledger (every segment owed to its required peers again) and reports it;
// a second start finds nothing to repair.
func TestDamagedDatabaseIsRepaired(t *testing.T) {
	for name, damage := range damages {
		t.Run(name, func(t *testing.T) {
			cfg := newRepairNode(t)
			damage(t, dbPath(cfg))
			damaged, err := os.ReadFile(dbPath(cfg))
			if err != nil {
				t.Fatal(err)
			}
			d, err := New(cfg, Options{Log: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("New after damage: %v", err)
			}
			defer d.Close()
			if d.dbRepair.MovedAside == "" || !strings.HasPrefix(d.dbRepair.MovedAside, dbPath(cfg)+".damaged-") {
				t.Fatalf("not set aside: %+v", d.dbRepair)
			}
			aside, err := os.ReadFile(d.dbRepair.MovedAside)
			if err != nil || !bytes.Equal(aside, damaged) {
				t.Fatalf("set-aside file differs from the damaged one (%v)", err)
			}
			checkRebuilt(t, d, nil)
			st, err := (backend{d}).Storage(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.DBMovedAside != d.dbRepair.MovedAside || st.DBDamage == "" || len(st.Rebuilt) != len(repairSegments) {
				t.Fatalf("storage RPC %+v", st)
			}
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			d2, err := New(cfg, Options{Log: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			if d2.dbRepair.MovedAside != "" || len(d2.store.Recovered().Rebuilt) != 0 {
				t.Fatalf("second start repaired again: %+v %+v", d2.dbRepair, d2.store.Recovered())
			}
		})
	}
}

// checkRebuilt: every repair segment but those in gone is indexed with
// its digest, tagged provenance, and a scheduled record for b after
// reconciliation; what is gone has no entry and no live record.
func checkRebuilt(t *testing.T, d *Daemon, gone []string) {
	t.Helper()
	if _, err := d.ex.Reconcile(); err != nil {
		t.Fatal(err)
	}
	for id, b := range repairSegments {
		e, err := d.store.Stat(id)
		if slices.Contains(gone, id) {
			if !errors.Is(err, segstore.ErrNotFound) {
				t.Errorf("%s: Stat = %+v, %v; want not found", id, e, err)
			}
			continue
		}
		if err != nil || e.SHA256 != digest(b) || e.Rebuilt != segstore.RebuiltFromTag || e.Relayed {
			t.Errorf("%s: entry %+v, %v", id, e, err)
		}
		if err := d.store.Verify(id); err != nil {
			t.Error(err)
		}
		r, err := d.led.Get(id, "b")
		if err != nil || r.State.String() != "scheduled" {
			t.Errorf("%s: record for b %+v, %v", id, r, err)
		}
	}
	if u := d.store.Usage(); u.Segments != int64(len(repairSegments)-len(gone)) {
		t.Errorf("usage %+v", u)
	}
}

// TestDamagedSegmentFile: with the database intact, a torn segment file
// (wrong size) is quarantined at every start, and one with a flipped byte
// when the start hashes the files: after an unclean stop (no clean-stop
// marker) under the default unclean_stop, and always under always. A
// quarantined file is not served and not deleted, and its pending delivery
// is deadlettered by reconciliation rather than sent.
func TestDamagedSegmentFile(t *testing.T) {
	flip := func(t *testing.T, path string, off int64) { overwrite(t, path, off+100, 4) }
	torn := func(t *testing.T, path string, off int64) {
		if err := os.Truncate(path, off+777); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []damaged{
		{"flipped byte, unclean stop", flip, config.VerifyUncleanStop, false, true},
		{"flipped byte, clean stop", flip, config.VerifyUncleanStop, true, false},
		{"flipped byte, clean stop, always", flip, config.VerifyAlways, true, true},
		{"flipped byte, unclean stop, never", flip, config.VerifyNever, false, false},
		{"torn, clean stop", torn, config.VerifyUncleanStop, true, true},
		{"torn, never", torn, config.VerifyNever, false, true},
	} {
		for _, m := range storageModes {
			t.Run(m.name+"/"+c.name, func(t *testing.T) { damagedSegmentFile(t, m.mod, c) })
		}
	}
}

// damaged is one case of TestDamagedSegmentFile.
type damaged struct {
	name        string
	damage      func(t *testing.T, path string, off int64) // off: where the content starts in path
	mode        string
	clean       bool // the previous run stopped cleanly
	quarantined bool
}

func damagedSegmentFile(t *testing.T, mod func(*config.Config), c damaged) {
	cfg := newRepairNode(t, mod) // closed: clean stop
	path, off := segmentAt(t, cfg, "seg-2")
	if !c.clean {
		if err := os.Remove(filepath.Join(cfg.Storage.Dir, CleanStopFile)); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Storage.VerifyOnStart = c.mode
	c.damage(t, path, off)
	d, err := New(cfg, Options{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := os.Stat(filepath.Join(cfg.Storage.Dir, CleanStopFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("clean-stop marker still there while running: %v", err)
	}
	rep := d.store.Recovered()
	if d.dbRepair.MovedAside != "" || d.cleanStop != c.clean {
		t.Fatalf("repairs %+v, clean stop %v", d.dbRepair, d.cleanStop)
	}
	if !c.quarantined {
		if len(rep.Quarantined) != 0 || rep.Verified != 0 {
			t.Fatalf("report %+v, want nothing hashed or quarantined", rep)
		}
		return
	}
	if len(rep.Quarantined) != 1 || rep.Quarantined[0].ID != "seg-2" {
		t.Fatalf("report %+v", rep)
	}
	if _, err := os.Stat(filepath.Join(cfg.Storage.Dir, segstore.QuarantineDir, rep.Quarantined[0].File)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ex.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if r, err := d.led.Get("seg-2", "b"); err != nil || r.State.String() != "deadletter" {
		t.Fatalf("record of the quarantined segment: %+v, %v", r, err)
	}
	st, _ := (backend{d}).Storage(context.Background())
	if len(st.Quarantined) != 1 || st.Quarantined[0].Segment != "seg-2" || st.Quarantined[0].Reason == "" ||
		st.PreviousStopClean != c.clean {
		t.Fatalf("storage RPC %+v", st)
	}
}

// TestDamagedDatabaseAndSegment: both at once. The segment whose content
// no longer matches its digest tag is quarantined, the others rebuilt.
func TestDamagedDatabaseAndSegment(t *testing.T) {
	for _, m := range storageModes {
		t.Run(m.name, func(t *testing.T) { damagedDatabaseAndSegment(t, m.mod) })
	}
}

func damagedDatabaseAndSegment(t *testing.T, mod func(*config.Config)) {
	cfg := newRepairNode(t, mod)
	path, off := segmentAt(t, cfg, "seg-3")
	damages["data pages garbled"](t, dbPath(cfg))
	overwrite(t, path, off+1000, 8)
	d, err := New(cfg, Options{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rep := d.store.Recovered()
	if d.dbRepair.MovedAside == "" || len(rep.Quarantined) != 1 || rep.Quarantined[0].ID != "seg-3" {
		t.Fatalf("repairs %+v %+v", d.dbRepair, rep)
	}
	checkRebuilt(t, d, []string{"seg-3"})
}

// TestLockedDatabaseIsNotDamage: a database another process holds is not
// set aside: that is a deployment mistake, and the ledger in it is good.
func TestLockedDatabaseIsNotDamage(t *testing.T) {
	cfg := newRepairNode(t)
	db, err := bolt.Open(dbPath(cfg), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = New(cfg, Options{Log: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("New = %v", err)
	}
	if m, _ := filepath.Glob(dbPath(cfg) + ".damaged-*"); len(m) != 0 {
		t.Fatalf("set aside: %v", m)
	}
}
