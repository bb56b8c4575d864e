package relayserve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/relaycore"
)

// holdingStore holds the first target Apply (a fire in flight) until
// release is closed or its context ends, and reports that context's error
// when it goes on.
type holdingStore struct {
	relaycore.Store
	once     sync.Once
	entered  chan struct{}
	release  chan struct{}
	afterCtx chan error
}

func newHoldingStore(s relaycore.Store) *holdingStore {
	return &holdingStore{Store: s, entered: make(chan struct{}), release: make(chan struct{}), afterCtx: make(chan error, 1)}
}

func (s *holdingStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	first := false
	s.once.Do(func() { first = true; close(s.entered) })
	if first {
		select {
		case <-s.release:
		case <-ctx.Done():
		}
		s.afterCtx <- ctx.Err()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return s.Store.Apply(ctx, p, b)
}

// logLines is a log destination that hands each JSON line's msg to
// waiters.
type logLines struct {
	w     *io.PipeWriter
	lines chan map[string]any
}

func newLogLines(t *testing.T) *logLines {
	r, w := io.Pipe()
	l := &logLines{w: w, lines: make(chan map[string]any, 1024)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				l.lines <- m
			}
		}
	}()
	t.Cleanup(func() { w.Close() })
	return l
}

func (l *logLines) wait(t *testing.T, msg string) map[string]any {
	t.Helper()
	deadline := time.After(60 * time.Second) // a hang guard
	for {
		select {
		case m := <-l.lines:
			if m["msg"] == msg {
				return m
			}
		case <-deadline:
			t.Fatalf("no log line %q", msg)
		}
	}
}

func runServer(t *testing.T, cfg Config, wrap func(relaycore.Store) relaycore.Store) (cancel func(), done chan error, url string, logs *logLines) {
	t.Helper()
	logs = newLogLines(t)
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Options{Logger: slog.New(slog.NewJSONHandler(logs.w, nil)), wrapTarget: wrap})
	}()
	url = logs.wait(t, "relay serve: listening")["url"].(string)
	return cancel, done, url, logs
}

func enqueueOne(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/sources/orders/rows", "application/json",
		strings.NewReader(`{"rows":[{"target":"t1","puts":[{"key":"k","value":"dg=="}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("enqueue: %d", resp.StatusCode)
	}
}

func testConfig(t *testing.T, drain string) Config {
	t.Helper()
	cfg, err := Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
db: %s
auth: {anonymous: {produce: ["*"], read: true}}
alarms: {sweep_interval: 1s, claim_ttl: 1s}
drain_timeout: %s
`, filepath.Join(t.TempDir(), "relay.db"), drain)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A fire in flight when the drain starts finishes on an uncancelled
// context: its row is delivered and the outbox is empty when Run returns.
func TestDrainLetsFiresFinish(t *testing.T) {
	cfg := testConfig(t, "60s")
	var hold *holdingStore
	cancel, done, url, logs := runServer(t, cfg, func(s relaycore.Store) relaycore.Store { hold = newHoldingStore(s); return hold })
	enqueueOne(t, url)
	<-hold.entered
	cancel()
	logs.wait(t, "relay serve: draining")
	close(hold.release)
	if err := <-hold.afterCtx; err != nil {
		t.Fatalf("the in-flight fire's context was cancelled by the drain: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	db, err := bolt.Open(cfg.DB, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if v, ok, err := db.Store(TargetTable).Get(ctx, "t1", "k"); err != nil || !ok || string(v) != "v" {
		t.Fatalf("target t1/k = %q %v %v: the fire did not finish", v, ok, err)
	}
	st, err := relaycore.SourceRelayState(ctx, db.Store(SourceTable), "orders", time.Now())
	if err != nil || !st.Empty {
		t.Fatalf("outbox after the drain: %+v %v", st, err)
	}
}

// A fire still running at the drain deadline is cancelled: Run says the
// drain was forced, the row stays in the outbox with its durable alarm,
// and the next start delivers it.
func TestForcedDrainLosesNothing(t *testing.T) {
	cfg := testConfig(t, "1s")
	var hold *holdingStore
	cancel, done, url, _ := runServer(t, cfg, func(s relaycore.Store) relaycore.Store { hold = newHoldingStore(s); return hold })
	enqueueOne(t, url)
	<-hold.entered
	cancel() // hold.release stays open: the fire outlives the drain deadline
	if err := <-hold.afterCtx; err == nil {
		t.Fatal("the fire was not cancelled at the drain deadline")
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "drain timed out") {
		t.Fatalf("Run after a forced drain: %v", err)
	}
	db, err := bolt.Open(cfg.DB, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, ok, err := db.Store(SourceTable).Get(ctx, "orders", relaycore.KeyAlarm); err != nil || !ok {
		t.Fatalf("no durable alarm left for the undelivered row (%v, %v)", ok, err)
	}
	db.Close()

	cancel, done, url, _ = runServer(t, cfg, nil)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url + "/v1/sources/orders/delivered-through?seq=1")
		if err != nil {
			t.Fatal(err)
		}
		var d struct{ Delivered bool }
		json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if d.Delivered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not delivered after the restart")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A file another process holds (here another open of it: bbolt's lock is
// per open file) stops the start with an error that names the file and
// what to do, not bbolt's bare "timeout".
func TestLockedFileNamed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relay.db")
	held, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	cfg, err := Parse([]byte("listen: 127.0.0.1:0\ndb: " + path + "\nauth: {anonymous: {read: true}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = Run(context.Background(), cfg, Options{})
	if err == nil || !strings.Contains(err.Error(), "db "+path+" is locked by another process") || !strings.Contains(err.Error(), "stop it") {
		t.Fatalf("Run on a held file: %v", err)
	}
}

// scanHolder holds target scans (the target read routes) until the
// request's context ends: a request still running at the drain deadline.
type scanHolder struct {
	relaycore.Store
	once    sync.Once
	entered chan struct{}
}

func (s *scanHolder) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	if p != "t1" {
		// The request's target only: the takedown owner's passes scan
		// their own partitions.
		return s.Store.Scan(ctx, p, req)
	}
	s.once.Do(func() { close(s.entered) })
	<-ctx.Done()
	return relaycore.ScanPage{}, ctx.Err()
}

// A drain forced by a request, with no fire running, says so and only so:
// no warning about fires that are not there.
func TestForcedByRequestNamesNoFires(t *testing.T) {
	cfg := testConfig(t, "300ms")
	hold := &scanHolder{entered: make(chan struct{})}
	cancel, done, url, logs := runServer(t, cfg, func(s relaycore.Store) relaycore.Store { hold.Store = s; return hold })
	go func() {
		if resp, err := http.Get(url + "/v1/targets/t1/items"); err == nil {
			resp.Body.Close()
		}
	}()
	<-hold.entered
	cancel()
	hang := time.After(60 * time.Second) // a hang guard
	for {
		var m map[string]any
		select {
		case m = <-logs.lines:
		case <-hang:
			t.Fatal("no relay serve: stopped line")
		}
		if m["msg"] == "relay serve: fires still running at the drain deadline; cancelling them (their claims lapse, their alarms fire after restart)" {
			t.Fatalf("warned of fires with none running: %v", m)
		}
		if m["msg"] == "relay serve: stopped" {
			if m["forced"] != true {
				t.Fatalf("stopped %v: the request was cut, so the drain was forced", m)
			}
			break
		}
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "drain timed out") {
		t.Fatalf("Run: %v", err)
	}
}
