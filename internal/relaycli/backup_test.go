package relaycli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/relaycore"
)

// relay backup --db copies a stopped relay's file to a file name or, as
// cp does, into a directory under the file's own name.
func TestBackupDBIntoDirectory(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "relay.db")
	db, err := bolt.Open(src, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Store("source").Apply(context.Background(), "orders", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("v")}}}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	outDir := t.TempDir()
	for _, tc := range []struct{ out, want string }{
		{outDir, filepath.Join(outDir, "relay.db")},
		{filepath.Join(outDir, "named.db"), filepath.Join(outDir, "named.db")},
	} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), []string{"backup", "--db", src, tc.out}, &out, &errb); code != 0 {
			t.Fatalf("backup --db %s %s: exit %d: %s", src, tc.out, code, errb.String())
		}
		if want := "relay backup: wrote " + tc.want + "\n"; out.String() != want {
			t.Errorf("stdout %q, want %q", out.String(), want)
		}
		copyDB, err := bolt.Open(tc.want, bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok, err := copyDB.Store("source").Get(context.Background(), "orders", "k")
		if err != nil || !ok || string(v) != "v" {
			t.Errorf("%s: orders/k = %q, %v, %v", tc.want, v, ok, err)
		}
		if err := copyDB.Check(); err != nil {
			t.Error(err)
		}
		copyDB.Close()
	}
}

// A file another process holds (here another open of it: bbolt's lock is
// per open file) is named as locked, with what to do, by the commands
// that take --db, not with bbolt's bare "timeout".
func TestLockedFileNamed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	held, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"status", "--db", path, "orders"}, &out, &errb); code == 0 {
		t.Fatalf("status on a held file: exit 0: %s", out.String())
	}
	if !strings.Contains(errb.String(), path+" is locked by another process, likely a running relay serve") {
		t.Fatalf("status on a held file: %s", errb.String())
	}
}

// A server certificate from a CA the system does not trust is refused
// with the flag that fixes it.
func TestBackupURLNamesCAFlag(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"backup", "--url", srv.URL, t.TempDir()}, &out, &errb); code == 0 {
		t.Fatal("accepted an unknown CA")
	}
	if !strings.Contains(errb.String(), "give --ca the CA certificate") {
		t.Fatalf("stderr: %s", errb.String())
	}
}

// A backup never replaces a file a process holds open: written into a
// running relay's own directory, it would swap the live file for the
// snapshot under the process (which goes on writing to the unlinked
// file). The held file stays as it was and nothing is left beside it.
func TestBackupDoesNotReplaceAHeldFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "relay.db")
	db, err := bolt.Open(src, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Store("source").Apply(context.Background(), "orders", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("backup")}}}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	live := t.TempDir()
	held, err := bolt.Open(filepath.Join(live, "relay.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := held.Store("source").Apply(context.Background(), "orders", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("live")}}}); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(filepath.Join(live, "relay.db"))
	if err != nil {
		t.Fatal(err)
	}
	_, errOut := cli(t, 1, "", "backup", "--db", src, live)
	if !strings.Contains(errOut, "held open by a running process") {
		t.Fatalf("stderr %s", errOut)
	}
	after, err := os.Stat(filepath.Join(live, "relay.db"))
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the live file was replaced (%v)", err)
	}
	if ents, _ := os.ReadDir(live); len(ents) != 1 {
		t.Fatalf("left beside the live file: %v", ents)
	}
}
