package relaybackup_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
)

var relayBin string

func TestMain(m *testing.M) { os.Exit(pgtest.After(servetest.Main(m, &relayBin))) }

// TestServeBackupOnPostgres: the backup route of a server on PostgreSQL
// answers 501 not_supported naming the database's own backups, and
// `relay backup --url` says so, exits non-zero and writes nothing.
func TestServeBackupOnPostgres(t *testing.T) {
	dir := t.TempDir()
	const tok = "relay_backup_operator"
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte("operator "+relayserve.HashToken(tok)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "operator.token"), []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
store: {type: postgres, postgres: {dsn: %q}}
auth: {tokens_file: %s/tokens}
principals:
  operator: {read: true, operate: true}
`, pgtest.NewDatabase(t), dir)
	p := servetest.Start(t, relayBin, servetest.WriteConfig(t, cfg))
	out := t.TempDir()
	msg, err := relayCmd(t, "backup", "--url", p.URL, "--token-file", filepath.Join(dir, "operator.token"), out)
	if err == nil || !strings.Contains(msg, "501 Not Implemented: not_supported") || !strings.Contains(msg, "pg_dump") || !strings.Contains(msg, "point-in-time recovery") {
		t.Errorf("relay backup of a server on PostgreSQL: %v\n%s", err, msg)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("relay backup wrote %v", entries)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("relay serve exited %d", code)
	}
}

// relayCmd runs the relay binary and returns its combined output.
func relayCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(relayBin, args...).CombinedOutput()
	return string(out), err
}

// TestServeBackupUnderLoad: `relay serve` with its targets in a second
// file takes HTTP enqueues of 100 rows while `relay backup --url` fetches
// backups through it; each backup is a consistent relay state holding at
// least every row acknowledged before it was asked for. `relay backup
// --db` refuses the running server's file (locked) and, once the server
// is stopped, copies it; only an operator may fetch a backup.
func TestServeBackupUnderLoad(t *testing.T) {
	dir := t.TempDir()
	const producerTok, operatorTok = "relay_backup_producer", "relay_backup_operator"
	tokens := fmt.Sprintf("producer %s\noperator %s\n", relayserve.HashToken(producerTok), relayserve.HashToken(operatorTok))
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"producer.token": producerTok, "operator.token": operatorTok} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
db: %[1]s/relay.db
targets: {db: %[1]s/targets.db}
budget: {plan: paid}
auth: {tokens_file: %[1]s/tokens}
principals:
  producer: {produce: [%[2]s], read: true}
  operator: {read: true, operate: true}
`, dir, source)
	p := servetest.Start(t, relayBin, servetest.WriteConfig(t, cfg))
	client := p.Client(nil)

	ctx, stop := context.WithCancel(t.Context())
	l := &load{row: map[uint64]uint64{}, more: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	loadErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for next := uint64(1); ctx.Err() == nil; next += 100 {
			var body api.EnqueueRequest
			for i := range uint64(100) {
				v := base64.StdEncoding.EncodeToString(fmt.Append(nil, next+i))
				body.Rows = append(body.Rows, api.RowJSON{Target: string(targetOf(next + i)), Puts: []api.PutJSON{{Key: keyOf(next + i), Value: &v}}})
			}
			data, _ := json.Marshal(body)
			req, _ := http.NewRequestWithContext(ctx, "POST", p.URL+"/v1/sources/"+source+"/rows", bytes.NewReader(data))
			req.Header.Set("content-type", "application/json")
			req.Header.Set("authorization", "Bearer "+producerTok)
			resp, err := client.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					loadErr <- err
				}
				return
			}
			var res api.EnqueueResponse
			err = json.NewDecoder(resp.Body).Decode(&res)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || len(res.Seqs) != 100 {
				loadErr <- fmt.Errorf("enqueue: %d %+v %v", resp.StatusCode, res, err)
				return
			}
			l.ack(res.Seqs, next)
		}
	}()

	for i := range 3 {
		for range 3 {
			select {
			case <-l.more:
			case err := <-loadErr:
				t.Fatal(err)
			}
		}
		before := l.ackedSeq()
		out := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.Mkdir(out, 0o700); err != nil {
			t.Fatal(err)
		}
		if msg, err := relayCmd(t, "backup", "--url", p.URL, "--token-file", filepath.Join(dir, "operator.token"), out); err != nil {
			t.Fatalf("relay backup --url: %v\n%s", err, msg)
		}
		last, err := checkBackup(t.Context(), l, out, before)
		if err != nil {
			t.Fatalf("backup %d: %v", i, err)
		}
		t.Logf("backup %d: seqs 1..%d (%d acknowledged before)", i, last, before)
	}
	stop()
	wg.Wait()

	msg, err := relayCmd(t, "backup", "--url", p.URL, "--token-file", filepath.Join(dir, "producer.token"), t.TempDir())
	if err == nil || !strings.Contains(msg, "403") {
		t.Errorf("a producer's backup: %v\n%s", err, msg)
	}
	msg, err = relayCmd(t, "backup", "--db", filepath.Join(dir, "relay.db"), filepath.Join(t.TempDir(), "copy.db"))
	if err == nil || !strings.Contains(msg, "locked") || !strings.Contains(msg, "--url") {
		t.Errorf("backup of a running server's file: %v\n%s", err, msg)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("relay serve exited %d", code)
	}
	copyPath := filepath.Join(t.TempDir(), "copy.db")
	if msg, err := relayCmd(t, "backup", "--db", filepath.Join(dir, "relay.db"), copyPath); err != nil {
		t.Fatalf("backup of a stopped server's file: %v\n%s", err, msg)
	}
	if msg, err := relayCmd(t, "status", "--db", copyPath, source); err != nil || !strings.Contains(msg, `"source": "orders"`) {
		t.Fatalf("relay status on the copy: %v\n%s", err, msg)
	}
}
