package relaybackup_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/internal/relaybackup"
	"github.com/relay-dev/relay/relaycore"
)

const (
	source  = "orders"
	targets = 8
)

// Row n of the load (counting from 1 in the order the writer sends them)
// goes to targetOf(n) under keyOf(n) with value n. The engine gives seqs
// in its own order within a batch, so the writer records each row's seq.
func targetOf(n uint64) relaycore.Partition {
	return relaycore.Partition(fmt.Sprintf("t%d", n%targets))
}
func keyOf(n uint64) string { return fmt.Sprintf("k/%08d", n) }

// load is what the writer has had acknowledged: the row of each seq.
type load struct {
	mu    sync.Mutex
	row   map[uint64]uint64 // seq -> row number
	acked uint64            // the highest acknowledged seq
	more  chan struct{}     // signalled after each acknowledged batch
}

func (l *load) ack(seqs []uint64, first uint64) {
	l.mu.Lock()
	for i, s := range seqs {
		l.row[s] = first + uint64(i)
		l.acked = max(l.acked, s)
	}
	l.mu.Unlock()
	select {
	case l.more <- struct{}{}:
	default:
	}
}

func (l *load) ackedSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acked
}

// rowOf waits until seq's batch is acknowledged (a backup may hold a
// batch whose answer the writer has not yet read) and returns its row.
func (l *load) rowOf(ctx context.Context, seq uint64) (uint64, error) {
	for {
		l.mu.Lock()
		n, ok := l.row[seq]
		l.mu.Unlock()
		if ok {
			return n, nil
		}
		select {
		case <-l.more:
		case <-ctx.Done():
			return 0, fmt.Errorf("seq %d never acknowledged", seq)
		}
	}
}

// checkBackup opens a backup's two files and checks that it is a relay
// state that could have existed: every row the source gave a seq is either
// applied at its target (seq <= the target's rh: the key is there with its
// value) or still in the outbox, no target is ahead of its source, and at
// least the rows acknowledged before the backup was asked for are in it.
// It returns the backup's last seq.
func checkBackup(ctx context.Context, l *load, dir string, ackedBefore uint64) (uint64, error) {
	src, err := bolt.Open(filepath.Join(dir, "relay.db"), bolt.Options{})
	if err != nil {
		return 0, err
	}
	defer src.Close()
	dst, err := bolt.Open(filepath.Join(dir, "targets.db"), bolt.Options{})
	if err != nil {
		return 0, err
	}
	defer dst.Close()
	v, err := relaycore.InspectSource(ctx, src.Store("source"), source)
	if err != nil {
		return 0, fmt.Errorf("the source does not decode: %w", err)
	}
	last := v.OS.NextSeq - 1
	if last < ackedBefore {
		return last, fmt.Errorf("the backup holds seqs 1..%d, but %d were acknowledged before it was asked for", last, ackedBefore)
	}
	outbox := map[uint64]bool{}
	for _, r := range v.Rows() {
		outbox[r.Seq] = true
	}
	rh := map[relaycore.Partition]uint64{}
	for i := range uint64(targets) {
		tp := targetOf(i)
		if rh[tp], err = relaycore.TargetWatermark(ctx, dst.Store("target"), tp, source); err != nil {
			return last, err
		}
		if rh[tp] > last {
			return last, fmt.Errorf("target %s has rh %d, past the source's last seq %d: restored, it would skip new rows", tp, rh[tp], last)
		}
	}
	for seq := uint64(1); seq <= last; seq++ {
		n, err := l.rowOf(ctx, seq)
		if err != nil {
			return last, err
		}
		tp := targetOf(n)
		val, found, err := dst.Store("target").Get(ctx, tp, keyOf(n))
		if err != nil {
			return last, err
		}
		switch {
		case seq <= rh[tp] && (!found || string(val) != fmt.Sprint(n)):
			return last, fmt.Errorf("seq %d is applied at %s (rh %d) but its key holds %q (found %v)", seq, tp, rh[tp], val, found)
		case seq > rh[tp] && found:
			return last, fmt.Errorf("seq %d is past %s's rh %d but its key is there", seq, tp, rh[tp])
		case seq > rh[tp] && !outbox[seq]:
			return last, fmt.Errorf("seq %d is neither applied at %s (rh %d) nor in the outbox: lost", seq, tp, rh[tp])
		}
	}
	return last, nil
}

// TestBackupUnderLoad: while one writer enqueues 100-row batches and
// alarms deliver them (source and targets in two files, as `relay serve`
// with targets.db runs), backups fetched through the handler are complete
// bbolt files that pass the check and hold a consistent relay state: the
// two files' snapshots are taken at one instant.
func TestBackupUnderLoad(t *testing.T) {
	dir := t.TempDir()
	srcDB, err := bolt.Open(filepath.Join(dir, "relay.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srcDB.Close()
	dstDB, err := bolt.Open(filepath.Join(dir, "targets.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dstDB.Close()
	budget, err := relaycore.PlanBudget("paid")
	if err != nil {
		t.Fatal(err)
	}
	src, dst := srcDB.Store("source"), dstDB.Store("target")
	relay := &relaycore.RelayHandler{Source: src, Target: dst, Budget: budget}
	srv := httptest.NewServer(relaybackup.Handler(nil, relaybackup.File{Name: "relay.db", DB: srcDB}, relaybackup.File{Name: "targets.db", DB: dstDB}))
	defer srv.Close()

	ctx, stop := context.WithCancel(t.Context())
	var (
		l       = &load{row: map[uint64]uint64{}, more: make(chan struct{}, 1)}
		wg      sync.WaitGroup
		loadErr = make(chan error, 2)
	)
	wg.Add(2)
	go func() { // the writer
		defer wg.Done()
		for next := uint64(1); ctx.Err() == nil; next += 100 {
			rows := make([]relaycore.Row, 100)
			for i := range rows {
				n := next + uint64(i)
				rows[i] = relaycore.Row{Target: targetOf(n), Puts: []relaycore.KV{{Key: keyOf(n), Value: []byte(fmt.Sprint(n))}}}
			}
			res, err := (&relaycore.RelayHandler{Source: src, Clock: relaycore.SystemClock{}}).Enqueue(ctx, source, rows, relaycore.EnqueueOptions{})
			if err != nil {
				if ctx.Err() == nil {
					loadErr <- err
				}
				return
			}
			l.ack(res.Seqs, next)
		}
	}()
	go func() { // the alarms
		defer wg.Done()
		for ctx.Err() == nil {
			if _, err := relay.Alarm(ctx, source); err != nil && ctx.Err() == nil {
				loadErr <- err
				return
			}
		}
	}()

	var lasts []uint64
	for i := range 3 {
		for range 3 { // let the load move on between backups
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
		req, _ := http.NewRequest("GET", srv.URL, nil)
		paths, err := relaybackup.Fetch(t.Context(), srv.Client(), req, out)
		if err != nil {
			t.Fatal(err)
		}
		if len(paths) != 2 {
			t.Fatalf("fetched %v", paths)
		}
		last, err := checkBackup(t.Context(), l, out, before)
		if err != nil {
			t.Fatalf("backup %d: %v", i, err)
		}
		lasts = append(lasts, last)
	}
	stop()
	wg.Wait()
	select {
	case err := <-loadErr:
		t.Fatal(err)
	default:
	}
	t.Logf("backups hold seqs through %v", lasts)
}

// TestHandlerRefuses: only GET; a stream cut short is an error and
// leaves no file under the copy's name; a server error is reported.
func TestHandlerRefuses(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "relay.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	h := relaybackup.Handler(nil, relaybackup.File{Name: "relay.db", DB: db})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/admin/backup", nil))
	if rec.Code != 405 || rec.Header().Get("allow") != "GET" {
		t.Fatalf("POST: %d %s", rec.Code, rec.Body)
	}

	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		w.Header().Set("content-length", rec.Header().Get("content-length"))
		w.Write(body[:len(body)/2]) // the connection breaks halfway
	}))
	defer cut.Close()
	out := t.TempDir()
	req, _ := http.NewRequest("GET", cut.URL, nil)
	if _, err := relaybackup.Fetch(t.Context(), cut.Client(), req, out); err == nil {
		t.Fatal("a cut stream was fetched without error")
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Fatalf("a cut stream left %v", entries)
	}

	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"code":"forbidden","message":"operate role required"}}`, http.StatusForbidden)
	}))
	defer refuse.Close()
	req, _ = http.NewRequest("GET", refuse.URL, nil)
	if _, err := relaybackup.Fetch(t.Context(), refuse.Client(), req, out); err == nil || !strings.Contains(err.Error(), "operate role required") {
		t.Fatalf("refused fetch: %v", err)
	}
}

// TestCheckCatchesSkewedFiles: copies of the source and targets files
// taken at different instants (the targets first, then a fire, then the
// source) are not a state that could have existed: the rows the fire
// delivered are in neither copy. checkBackup says so, which is why the
// handler snapshots both files at one instant (bolt.Snapshots).
func TestCheckCatchesSkewedFiles(t *testing.T) {
	dir := t.TempDir()
	srcDB, err := bolt.Open(filepath.Join(dir, "relay.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srcDB.Close()
	dstDB, err := bolt.Open(filepath.Join(dir, "targets.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dstDB.Close()
	budget, _ := relaycore.PlanBudget("paid")
	src, dst := srcDB.Store("source"), dstDB.Store("target")
	relay := &relaycore.RelayHandler{Source: src, Target: dst, Budget: budget}
	l := &load{row: map[uint64]uint64{}, more: make(chan struct{}, 1)}
	rows := make([]relaycore.Row, 10)
	for i := range rows {
		n := uint64(i + 1)
		rows[i] = relaycore.Row{Target: targetOf(n), Puts: []relaycore.KV{{Key: keyOf(n), Value: []byte(fmt.Sprint(n))}}}
	}
	res, err := (&relaycore.RelayHandler{Source: src, Clock: relaycore.SystemClock{}}).Enqueue(t.Context(), source, rows, relaycore.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.ack(res.Seqs, 1)

	backup := func(name string, s *bolt.Snapshot) {
		t.Helper()
		defer s.Close()
		if err := relaybackup.WriteFile(filepath.Join(dir, "skewed", name), s.WriteTo); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "skewed"), 0o700); err != nil {
		t.Fatal(err)
	}
	ds, err := dstDB.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	backup("targets.db", ds)
	if ar, err := relay.Alarm(t.Context(), source); err != nil || !ar.Cleared {
		t.Fatalf("alarm: %+v %v", ar, err)
	}
	ss, err := srcDB.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	backup("relay.db", ss)
	if _, err := checkBackup(t.Context(), l, filepath.Join(dir, "skewed"), 10); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("skewed backup: %v, want rows lost", err)
	}

	snaps, err := bolt.Snapshots(srcDB, dstDB)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "together"), 0o700); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"relay.db", "targets.db"} {
		if err := relaybackup.WriteFile(filepath.Join(dir, "together", name), snaps[i].WriteTo); err != nil {
			t.Fatal(err)
		}
		snaps[i].Close()
	}
	if _, err := checkBackup(t.Context(), l, filepath.Join(dir, "together"), 10); err != nil {
		t.Fatal(err)
	}
}
