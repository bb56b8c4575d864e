package relay

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
	bolt "go.etcd.io/bbolt"
)

// offlineDialer is the real transport with an injected outage: while
// down, every dial fails at once, as to a peer that is switched off.
type offlineDialer struct {
	tr   *transport.Transport
	down atomic.Bool
}

var errOffline = errors.New("peer offline (injected)")

func (d *offlineDialer) Dial(ctx context.Context, addr, peerID string) (*wire.Conn, error) {
	if d.down.Load() {
		return nil, errOffline
	}
	return d.tr.Dial(ctx, addr, peerID)
}

// resyncResult is what a resync run measured.
type resyncResult struct {
	owed, held      int
	queries         []int         // entries per QUERY frame
	offers          int           // OFFER frames
	offered         []string      // their ids, in order
	received        []string      // SEGMENT frames the peer read
	missing         []string      // the segments the peer lacked
	conflict        string        // held by the peer with other content
	wall            time.Duration // from the peer coming back to the last ACK recorded
	deferredRecords int           // deferrals (a record may be deferred more than once)
}

// resyncAfterOffline: sender a owes owed segments to b; b's real store
// already holds all but every 101st of them, and holds the first of those
// under the same id with other content. a runs (with workers workers and
// the default dial timeout) while b is offline until a's dial circuit has
// failed twice (the first dial and one probe), so the backlog has been
// failed and deferred as after a real outage; then b comes back. Both
// stores are real; their bbolt files skip fsync (NoSync) to keep the
// set-up of 20,000 segments in seconds: the frames are what is measured.
func resyncAfterOffline(t testing.TB, owed, workers int) resyncResult {
	t.Helper()
	dir := pkitest.New(t, "a", "b")
	a := newNodeOpts(t, int64(owed), &bolt.Options{NoSync: true})
	bn := newNodeOpts(t, int64(owed), &bolt.Options{NoSync: true})
	b := newV2Peer(t, dir, wire.DefaultWindow, 0)
	b.store = bn.store
	res := resyncResult{owed: owed}
	ids := make([]string, owed)
	for i := range ids {
		ids[i] = fmt.Sprintf("seg-%05d", i)
		if i%101 == 100 {
			res.missing = append(res.missing, ids[i])
		}
	}
	res.conflict = res.missing[0]
	res.held = owed - len(res.missing)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < owed; i += 16 {
				content := []byte("content of " + ids[i])
				a.put(t, ids[i], content)
				switch {
				case ids[i] == res.conflict:
					bn.put(t, ids[i], []byte("other content under the same id"))
				case i%101 != 100:
					bn.put(t, ids[i], content)
				}
			}
		}()
	}
	wg.Wait()
	tr, err := transport.New(transport.Config{
		NodeID: "a", CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key"),
		CAFile: filepath.Join(dir, pki.CACertFile), AllowPeer: func(p string) bool { return p == "b" },
		Wire: wire.Options{IdleTimeout: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	d := &offlineDialer{tr: tr}
	d.down.Store(true)
	var failedDials atomic.Int32
	twoFailed := make(chan struct{})
	var deferred atomic.Int64
	ex, err := New(Config{
		Peers: map[string]string{"b": b.ln.Addr().String()}, Condition: ledger.AllPeers,
		Policy:  ledger.Policy{MaxRetries: 3, Initial: 20 * time.Millisecond, Max: 40 * time.Millisecond},
		Workers: workers, AckTimeout: time.Minute, Log: quietLog(t),
		Observer: Observer{
			Dialed: func(_ string, err error) {
				if err != nil && failedDials.Add(1) == 2 {
					close(twoFailed)
				}
			},
			Deferred: func(_ string, n int) { deferred.Add(int64(n)) },
		},
	}, a.led, a.store, d)
	if err != nil {
		t.Fatal(err)
	}
	// Scheduled in ledger order, as ingest would have.
	for _, id := range ids {
		e, err := a.store.Stat(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := ex.Schedule(e); err != nil {
			t.Fatal(err)
		}
	}
	run(t, ex)
	select {
	case <-twoFailed:
	case <-time.After(waitFor):
		t.Fatal("a never dialled b twice")
	}
	res.deferredRecords = int(deferred.Load())
	start := time.Now()
	d.down.Store(false)
	for _, id := range ids {
		if id == res.conflict {
			continue
		}
		a.waitRecord(t, id, "b", inState(ledger.StateAcked))
	}
	res.wall = time.Since(start)
	// The segment b holds with other content is refused, never counted
	// as held: it ends deadlettered after its retries, never Acked.
	a.waitRecord(t, res.conflict, "b", inState(ledger.StateDeadletter))
	b.mu.Lock()
	defer b.mu.Unlock()
	res.queries = slices.Clone(b.querySizes)
	res.offers = b.offered
	res.offered = slices.Clone(b.offeredIDs)
	res.received = slices.Clone(b.received)
	return res
}

// check asserts the resync goal on a measured run: QUERY frames
// within ⌈owed/4096⌉ + 1 (a full QUERY per 4096 due records, and one
// more that another stream may send about the last, new ones), no SEGMENT
// for a segment b held, and every OFFER is for a segment b lacked, except
// at most one: the dial circuit's probe, an ordinary single attempt made
// before anything is known about the peer.
func (r resyncResult) check(t testing.TB) {
	t.Helper()
	maxQueries := (r.owed+wire.MaxQuerySegments-1)/wire.MaxQuerySegments + 1
	if len(r.queries) > maxQueries {
		t.Errorf("%d QUERY frames %v, want at most %d", len(r.queries), r.queries, maxQueries)
	}
	lacked := map[string]bool{}
	for _, id := range r.missing {
		lacked[id] = true
	}
	for _, id := range r.received {
		if !lacked[id] {
			t.Errorf("b received %s, which it held", id)
		}
	}
	var heldOffers []string
	for _, id := range r.offered {
		if !lacked[id] {
			heldOffers = append(heldOffers, id)
		}
	}
	if len(heldOffers) > 1 {
		t.Errorf("%d OFFERs of segments b held (%v), want at most one (the circuit's probe)", len(heldOffers), heldOffers)
	}
	for _, id := range r.missing {
		if id != r.conflict && !slices.Contains(r.received, id) {
			t.Errorf("b never received %s", id)
		}
	}
	if slices.Contains(r.received, r.conflict) {
		t.Errorf("b received %s, which it holds with other content", r.conflict)
	}
}

func (r resyncResult) String() string {
	lacked := map[string]bool{}
	for _, id := range r.missing {
		lacked[id] = true
	}
	distinct := map[string]bool{}
	heldOffers := 0
	for _, id := range r.offered {
		distinct[id] = true
		if !lacked[id] {
			heldOffers++
		}
	}
	return fmt.Sprintf("%d owed, %d held: %d QUERY frames %v; %d OFFER frames for %d distinct segments (%d of them held: the probe; the one held with another digest refused at each of its attempts); %d segments sent; %d deferrals while offline; %v from reconnect to the last ACK",
		r.owed, r.held, len(r.queries), r.queries, r.offers, len(distinct), heldOffers, len(r.received), r.deferredRecords, r.wall.Round(time.Millisecond))
}

// TestResyncAfterOfflineScale is the resync goal at a tenth of its
// scale (1,010 owed, 1,000 held), with edged's four workers, after an
// outage: BenchmarkResyncAfterOffline runs the full 10,100.
func TestResyncAfterOfflineScale(t *testing.T) {
	r := resyncAfterOffline(t, 1010, 4)
	t.Log(r)
	r.check(t)
}

// BenchmarkResyncAfterOffline: the resync goal at full scale, a
// peer that holds 10,000 of 10,100 owed segments (make bench runs it
// once; the set-up takes most of the time).
func BenchmarkResyncAfterOffline(b *testing.B) {
	for range b.N {
		r := resyncAfterOffline(b, 10100, 4)
		b.Log(r)
		r.check(b)
		b.ReportMetric(float64(len(r.queries)), "queries")
		b.ReportMetric(float64(r.offers), "offers")
		b.ReportMetric(float64(len(r.received)), "segments-sent")
		b.ReportMetric(r.wall.Seconds(), "reconnect-s")
	}
}
