package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
)

// TestNewSyncsCreatedDirs: the first start creates storage.dir, the
// database file and segments/; the parent of each new directory and the
// directory holding the new database file are fsynced (the latter after
// the file exists). A second start creates nothing and syncs nothing.
func TestNewSyncsCreatedDirs(t *testing.T) {
	dir := pkitest.New(t, "a")
	base := t.TempDir()
	state := filepath.Join(base, "state")
	cfg := nodeConfig(t, dir, "a", "127.0.0.1:7400", "127.0.0.1:7401", []config.Peer{})
	cfg.Storage.Dir = state
	var synced []string
	dbSynced := false
	sync := func(d string) error {
		synced = append(synced, d)
		if _, err := os.Stat(filepath.Join(state, DBFile)); err == nil && d == state {
			dbSynced = true
		}
		return nil
	}
	d, err := New(cfg, Options{SyncDir: sync})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if !slices.Contains(synced, base) {
		t.Errorf("synced %v: the parent of storage.dir (%s) was not", synced, base)
	}
	if !dbSynced {
		t.Errorf("synced %v: storage.dir was not synced after %s was created", synced, DBFile)
	}
	synced = nil
	d, err = New(cfg, Options{SyncDir: sync})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if len(synced) != 0 {
		t.Errorf("restart synced %v; nothing was created", synced)
	}
	// A failed fsync of the new database's directory stops start-up.
	cfg.Storage.Dir = filepath.Join(base, "other")
	boom := errors.New("fsync failed")
	if _, err := New(cfg, Options{SyncDir: func(string) error { return boom }}); !errors.Is(err, boom) {
		t.Fatalf("New with failing fsync = %v", err)
	}
}
