package relayserve_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// smallTmpfs mounts a tmpfs of size bytes on a new directory and returns
// it; the test is skipped, saying why, where mounting is not permitted
// (not root, or a container without CAP_SYS_ADMIN). A real file system
// that fills up, rather than injected errors, so what bbolt does on a
// full disk is what the test sees.
func smallTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("mounting a %d-byte tmpfs for the full file system is not permitted here (%v): needs root or CAP_SYS_ADMIN", size, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file in dir until the file system refuses more.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			return path
		}
	}
}

// targets.db on a full file system: every delivery commit fails. The
// targets must show it (failed attempts, the last error naming the disk),
// the log must say it at WARN, and /readyz must turn 503 naming the file;
// once room is made, the rows are delivered once, the targets recover and
// /readyz is ready again. Before, both targets stayed active with no
// error, nothing was logged and /readyz stayed ready.
func TestTargetsOnFullFileSystem(t *testing.T) {
	dir := smallTmpfs(t, 256<<10)
	targetsDB := filepath.Join(dir, "targets.db")
	f := newFixture(t, "targets:\n  db: "+targetsDB+"\n")
	p := f.start(t)
	c := f.client(t, p, "")
	src := p.URL + "/v1/sources/orders"
	filler := fill(t, dir)

	r := do(t, c, "POST", src+"/rows", f.tokens["producer"], rowsBody("t1", "k", "one"))
	if r.status != 200 {
		t.Fatalf("enqueue: %d %s", r.status, r.body)
	}
	r = do(t, c, "POST", src+"/rows", f.tokens["producer"], rowsBody("t2", "k", "two"))
	if r.status != 200 {
		t.Fatalf("enqueue: %d %s", r.status, r.body)
	}
	line := p.WaitLog(t, "relay target failed: apply (rh unchanged: not applied)")
	if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, "no space left on device") {
		t.Fatalf("the failure's log line: %s", line)
	}
	// The fire records its failures in its checkpoint, on relay.db (which
	// has room), right after logging them: wait for that record.
	for _, tn := range []string{"t1", "t2"} {
		st := waitTarget(t, c, src, tn, f.tokens["operator"], func(st relaycore.TargetStatus) bool { return st.FailedAttempts > 0 })
		if st.State != relaycore.StateActive || st.Pending != 1 || st.LastError == nil || st.LastError.Class != relaycore.ErrorClassApply ||
			!strings.Contains(st.LastError.Message, "no space left on device") {
			t.Fatalf("%s on a full disk: %+v (last error %+v)", tn, st, st.LastError)
		}
	}
	r = do(t, c, "GET", p.URL+"/readyz", "", nil)
	if r.status != 503 || !strings.Contains(string(r.body), "targets.db") {
		t.Fatalf("/readyz with targets.db full: %d %s", r.status, r.body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, c, src, f.tokens["reader"], 2)
	for _, tn := range []string{"t1", "t2"} {
		if st := getTarget(t, c, src, tn, f.tokens["operator"]); st.State != relaycore.StateActive || st.Pending != 0 || st.FailedAttempts != 0 {
			t.Fatalf("%s after room was made: %+v", tn, st)
		}
	}
	if r := do(t, c, "GET", p.URL+"/readyz", "", nil); r.status != 200 {
		t.Fatalf("/readyz after a delivery committed: %d %s", r.status, r.body)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	db := openDB(t, targetsDB) // and bbolt's check of the file after the failed commits
	for tn, want := range map[string]string{"t1": "one", "t2": "two"} {
		v, ok, err := db.Store(relayserve.TargetTable).Get(context.Background(), relaycore.Partition(tn), "k")
		if err != nil || !ok || string(v) != want {
			t.Fatalf("%s/k = %q %v %v, want %q", tn, v, ok, err, want)
		}
	}
}

// getTarget reads a target's status through the operator route.
func getTarget(t *testing.T, c *http.Client, src, target, token string) relaycore.TargetStatus {
	t.Helper()
	r := do(t, c, "GET", src+"/targets/"+target, token, nil)
	if r.status != 200 {
		t.Fatalf("target %s: %d %s", target, r.status, r.body)
	}
	var tr api.TargetResponse
	if err := json.Unmarshal(r.body, &tr); err != nil {
		t.Fatalf("target %s: %s: %v", target, r.body, err)
	}
	return tr.Status
}

// waitTarget polls a target's status until ok; the deadline guards
// against a hang.
func waitTarget(t *testing.T, c *http.Client, src, target, token string, ok func(relaycore.TargetStatus) bool) relaycore.TargetStatus {
	t.Helper()
	deadline := time.Now().Add(servetest.StartTimeout)
	for {
		st := getTarget(t, c, src, target, token)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("target %s still %+v after %v", target, st, servetest.StartTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
