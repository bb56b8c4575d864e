package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// TestAbsentGuardsSerialize is the write-skew case that row locks alone
// get wrong: A is "x absent: put y", B is "y absent: put x". Run together,
// exactly one may win each round, because whichever commits first makes
// the other's precondition false. Without a lock on the absent keys both
// read "absent" and both commit (checked by dropping the lock statement
// from Apply: every run then fails within a few rounds).
func TestAbsentGuardsSerialize(t *testing.T) {
	s := freshStore(t, sharedDB(t))
	const rounds = 60
	for r := range rounds {
		p := relaycore.Partition(fmt.Sprintf("r%d", r))
		batches := []relaycore.Batch{
			{Preconditions: []relaycore.Precondition{{Key: "x", Absent: true}}, Writes: []relaycore.Write{{Key: "y", Value: []byte("A")}}},
			{Preconditions: []relaycore.Precondition{{Key: "y", Absent: true}}, Writes: []relaycore.Write{{Key: "x", Value: []byte("B")}}},
		}
		var (
			wg      sync.WaitGroup
			won     atomic.Int32
			errs    = make(chan error, 2)
			release = make(chan struct{})
		)
		for _, b := range batches {
			wg.Go(func() {
				<-release
				err := s.Apply(t.Context(), p, b)
				if _, failed := relaycore.FailedPrecondition(err); failed {
					return
				}
				if err != nil {
					errs <- err
					return
				}
				won.Add(1)
			})
		}
		close(release)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := won.Load(); n != 1 {
			t.Fatalf("round %d: %d of the two batches committed, want exactly 1", r, n)
		}
	}
}

// faultConn wraps a real connection to the server. Once armed, the next
// write that ends a pipeline (its last message is Sync) is handled as
// mode says:
//   - "drop-after" forwards it whole, then swallows the server's answer up
//     to its ReadyForQuery (so the server has finished, here committed)
//     and fails the read: the client sees a connection lost after sending,
//     while the server's outcome is settled. (Closing the socket at once
//     would race the server against the cancel request pgx sends when its
//     connection breaks.)
//   - "fail-before" sends nothing and fails the write.
type faultConn struct {
	net.Conn
	armed *atomic.Pointer[string]
	lost  atomic.Bool
}

// syncMsg is the protocol's Sync message: type 'S', length 4; readyMsg is
// the start of ReadyForQuery ('Z', length 5, then the status byte).
var (
	syncMsg  = []byte{'S', 0, 0, 0, 4}
	readyMsg = []byte{'Z', 0, 0, 0, 5}
)

func (c *faultConn) Write(p []byte) (int, error) {
	if bytes.HasSuffix(p, syncMsg) {
		if mode := c.armed.Swap(nil); mode != nil {
			switch *mode {
			case "drop-after":
				// Before the write: a background read that pgx starts
				// while a slow write is under way must not see the answer.
				c.lost.Store(true)
				return c.Conn.Write(p)
			case "fail-before":
				_ = c.Conn.Close()
				return 0, errors.New("injected: connection refused the write")
			}
		}
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Read(p []byte) (int, error) {
	if !c.lost.Load() {
		return c.Conn.Read(p)
	}
	var seen []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(seen, readyMsg) {
		n, err := c.Conn.Read(buf)
		seen = append(seen, buf[:n]...)
		if err != nil {
			break
		}
	}
	_ = c.Conn.Close()
	return 0, errors.New("injected: connection lost after the pipeline was sent")
}

// faultStore is a store on its own database through one connection that
// faultConn wraps, warmed up so its statements are prepared.
func faultStore(t *testing.T) (*postgres.Store, *atomic.Pointer[string]) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	armed := &atomic.Pointer[string]{}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &faultConn{Conn: c, armed: armed}, nil
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := postgres.Open(t.Context(), pool, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := db.Store("faults")
	if err := s.Apply(t.Context(), "p", relaycore.Batch{Writes: []relaycore.Write{{Key: "warm", Value: []byte("1")}}}); err != nil {
		t.Fatal(err)
	}
	return s, armed
}

func arm(a *atomic.Pointer[string], mode string) { a.Store(&mode) }

// TestLostCommitIsMaybeApplied: the pipeline reached the server, which
// committed it, and the connection died before the answer came back. The
// error must say "maybe applied" (here it was applied); reporting it as
// surely not applied would let the engine act on a batch it believes
// undone.
func TestLostCommitIsMaybeApplied(t *testing.T) {
	s, armed := faultStore(t)
	b := relaycore.Batch{
		Preconditions: []relaycore.Precondition{{Key: "k", Absent: true}},
		Writes:        []relaycore.Write{{Key: "k", Value: []byte("v")}},
	}
	arm(armed, "drop-after")
	err := s.Apply(t.Context(), "p", b)
	t.Logf("apply: %v", err)
	if err == nil || !relaycore.MayBeApplied(err) {
		t.Fatalf("apply with the answer lost = %v; want a maybe-applied error", err)
	}
	if _, ok := relaycore.FailedPrecondition(err); ok {
		t.Fatalf("apply with the answer lost = %v, a condition failure", err)
	}
	// The pool reconnects; the batch did land, and its guard now fails.
	v, found, err := s.Get(t.Context(), "p", "k")
	if err != nil || !found || string(v) != "v" {
		t.Fatalf("get after the lost commit = %q, %v, %v; want the batch applied\nserver log:\n%s", v, found, err, pgtest.Get(t).Log())
	}
	err = s.Apply(t.Context(), "p", b)
	if i, ok := relaycore.FailedPrecondition(err); !ok || i != 0 {
		t.Fatalf("re-applying the landed batch = %v; want its precondition 0 to fail", err)
	}
}

// TestUnsentBatchIsNotApplied: the write of the pipeline failed before any
// byte left, so the batch is surely not applied, and it says so.
func TestUnsentBatchIsNotApplied(t *testing.T) {
	s, armed := faultStore(t)
	arm(armed, "fail-before")
	err := s.Apply(t.Context(), "p", relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("v")}}})
	if err == nil || relaycore.MayBeApplied(err) {
		t.Fatalf("apply whose pipeline was never sent = %v; want a surely-not-applied error", err)
	}
	if _, found, err := s.Get(t.Context(), "p", "k"); err != nil || found {
		t.Fatalf("get after the unsent batch: found %v, %v; want absent", found, err)
	}
}
