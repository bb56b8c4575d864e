package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/wire"
)

// Dialer opens an authenticated connection to a peer. *transport.Transport
// implements it.
type Dialer interface {
	Dial(ctx context.Context, addr, peerID string) (*wire.Conn, error)
}

// Observer receives events for metrics. Every field is optional.
type Observer struct {
	// Attempt is called once per finished attempt with its outcome:
	// "acked", "failed", "deadletter", "postponed" or "cancelled".
	Attempt func(peer, outcome string, bytes int64, d time.Duration)
	// Relayed is called when a segment's success condition is first met.
	Relayed func(segmentID string)
	// Evicted is called after a segment was evicted on relay.
	Evicted func(segmentID string, bytes int64)
	// Deferred is called when n due records for peer were deferred
	// because its dial circuit is open.
	Deferred func(peer string, n int)
	// Dialed is called after every dial to a peer (err nil on success),
	// except dials cut short by the agent stopping.
	Dialed func(peer string, err error)
	// Removed is called when retention removed n ledger records.
	Removed func(n int)
}

// Config configures an Executor. Peers, Condition and Policy are required.
type Config struct {
	// Peers maps each known peer's node id to the address to dial.
	Peers map[string]string
	// Condition is relay.success_condition.
	Condition ledger.Condition
	// Policy is the retry budget (relay.max_retries, relay.backoff).
	Policy ledger.Policy
	// EvictOnRelay is relay.evict_on_relay.
	EvictOnRelay bool
	// Workers is relay.workers; default 4.
	Workers int
	// AckTimeout bounds the wait for the reply after the segment was sent;
	// default 30s.
	AckTimeout time.Duration
	// DialTimeout bounds connect, TLS handshake and HELLO; default 10s.
	DialTimeout time.Duration
	// PushMaxBytes is relay.push_max_bytes: on a version 2 connection a
	// record's first attempt of a segment up to this size is a PUSH
	// (wire.Item.Push), its bytes sent without waiting for an ACCEPT.
	// Zero (the default here; edged's default is wire.MaxPushSize)
	// offers every segment.
	PushMaxBytes int64
	// StopGrace is how long attempts in flight may continue after Run's
	// context is canceled before their connections are cut; default 5s.
	StopGrace time.Duration
	// Retention is relay.ledger_retention: how long the records of a
	// segment that is no longer stored are kept once all are Acked
	// (PruneSettled). Zero keeps them forever.
	Retention time.Duration
	// PoolIdle is how long an unused connection stays pooled; default 30s.
	// It must stay below the receivers' idle timeout.
	PoolIdle time.Duration
	// Now is the ledger clock; default time.Now.
	Now func() time.Time
	// Log receives the relay's log lines; default slog.Default().
	Log *slog.Logger
	// Observer is told about attempts, successes and evictions.
	Observer Observer
}

// Executor runs outbound delivery. Create it with New, call Reconcile
// once before Run, and Schedule after every segment stored.
type Executor struct {
	cfg   Config
	led   *ledger.Ledger
	store *segstore.Store
	dial  Dialer
	log   *slog.Logger
	pool  *pool
	// circuits is per-peer dial circuit state (circuit.go).
	circuits *circuits
	// full is per-peer room circuit state: a peer that refused for want
	// of room (full.go).
	full *circuits

	claimMu sync.Mutex // serialises claims so they follow ledger order
	// deferMu orders the ledger writes of deferrals (applyDeferrals)
	// against backlogDue's Expedite; see applyDeferrals.
	deferMu sync.Mutex
	wake    broadcast

	resyncMu  sync.Mutex
	resynced  map[string]bool // peers summarised since their last failure (window.go)
	resyncing map[string]bool // peers whose summary exchange is under way (window.go)

	mu      sync.Mutex
	running bool

	// reconcileBatch is the const of that name; tests make it smaller.
	reconcileBatch int
}

// New checks cfg and returns an Executor over a ledger and a segment store
// that share one bbolt database.
func New(cfg Config, led *ledger.Ledger, store *segstore.Store, d Dialer) (*Executor, error) {
	if !cfg.Condition.Valid() {
		return nil, fmt.Errorf("relay: %w: %q", ledger.ErrUnknownCondition, cfg.Condition)
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if led == nil || store == nil || d == nil {
		return nil, errors.New("relay: ledger, store and dialer are required")
	}
	for id := range cfg.Peers {
		if err := wire.CheckNodeID(id); err != nil {
			return nil, fmt.Errorf("relay: peer: %w", err)
		}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 30 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 5 * time.Second
	}
	if cfg.PoolIdle <= 0 {
		cfg.PoolIdle = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	dialCircuits := newCircuits(cfg.Policy, cfg.DialTimeout)
	dialCircuits.firstBack = true
	return &Executor{
		cfg: cfg, led: led, store: store, dial: d, log: cfg.Log,
		pool:     newPool(cfg.Workers, cfg.PoolIdle),
		resynced: map[string]bool{}, resyncing: map[string]bool{},
		circuits: dialCircuits,
		full:     newCircuits(cfg.Policy, cfg.DialTimeout+cfg.AckTimeout),
		wake:     newBroadcast(),

		reconcileBatch: reconcileBatch,
	}, nil
}

// PeerIDs returns the known peers in ascending order.
func (e *Executor) PeerIDs() []string {
	ids := make([]string, 0, len(e.cfg.Peers))
	for id := range e.cfg.Peers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// RequiredPeers returns the peers a stored segment is owed to: every known
// peer except the one it came from, ascending.
func (e *Executor) RequiredPeers(entry segstore.Entry) []string {
	ids := e.PeerIDs()
	out := ids[:0]
	for _, id := range ids {
		if id != entry.Source {
			out = append(out, id)
		}
	}
	return out
}

// Condition is the configured success condition.
func (e *Executor) Condition() ledger.Condition { return e.cfg.Condition }

// Schedule makes sure every required peer of entry has a ledger record
// (insert-if-absent, so it is idempotent and never resets a record), and
// wakes the workers if any record was created. Then it judges the success
// condition: a segment stored again after it was relayed and evicted (a
// sender resent it because our ACK was late) finds its records already
// Acked, so no terminal transition would ever mark or evict this copy.
func (e *Executor) Schedule(entry segstore.Entry) error {
	created, err := e.led.EnsureScheduled(entry.ID, e.RequiredPeers(entry), e.cfg.Now())
	if err != nil {
		return fmt.Errorf("schedule %s: %w", entry.ID, err)
	}
	if len(created) > 0 {
		e.log.Debug("relay scheduled", "segment", entry.ID, "peers", created)
		e.Kick()
	}
	e.checkSuccessCondition(entry.ID)
	return nil
}

// Kick wakes idle workers to look for due work, e.g. after an operator
// retried deadlettered records.
func (e *Executor) Kick() { e.wake.signal() }

// Run executes due ledger records with cfg.Workers workers until ctx is
// canceled. Then it stops claiming, lets attempts in flight finish for up
// to StopGrace, closes pooled connections and returns nil. Run may be
// called once.
func (e *Executor) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return errors.New("relay: Run called twice")
	}
	e.running = true
	e.mu.Unlock()

	// Attempts run under hard, which outlives ctx by StopGrace, so a
	// graceful stop does not turn every attempt in flight into a failure.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	stopGrace := context.AfterFunc(ctx, func() {
		t := time.NewTimer(e.cfg.StopGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancelHard()
		case <-hard.Done():
		}
	})
	defer stopGrace()

	var wg sync.WaitGroup
	if e.cfg.Retention > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.retentionLoop(ctx)
		}()
	}
	for range e.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.worker(ctx, hard)
		}()
	}
	wg.Wait()
	cancelHard()
	e.pool.closeAll()
	return nil
}

// idleRetry is how long a worker waits after a ledger error before it
// looks for work again.
const idleRetry = time.Second

func (e *Executor) worker(ctx, hard context.Context) {
	for ctx.Err() == nil {
		woken := e.wake.wait() // taken before looking, so no signal is missed
		c, ok, held, err := e.claimNext()
		if err != nil {
			e.log.Error("relay claim failed", "err", err)
			sleep(ctx, idleRetry, woken)
			continue
		}
		if ok {
			e.executeRelay(ctx, hard, c)
			c.release(e)
			continue
		}
		if held {
			// Due records wait for a summary exchange under way; its end
			// wakes the workers. The bound only matters for other peers'
			// records coming due meanwhile.
			sleep(ctx, idleRetry, woken)
			continue
		}
		next, ok, err := e.nextDue()
		if err != nil {
			e.log.Error("relay pending scan failed", "err", err)
			sleep(ctx, idleRetry, woken)
			continue
		}
		if !ok {
			sleep(ctx, forever, woken)
			continue
		}
		// The record may have come due since claimNext looked: a delay
		// of zero or less just loops at once.
		sleep(ctx, max(0, next.Sub(e.cfg.Now())), woken)
	}
}

// forever makes sleep wait for a wake-up or ctx only.
const forever time.Duration = -1

// sleep waits for d (or, for forever, indefinitely), a wake-up or ctx.
func sleep(ctx context.Context, d time.Duration, woken <-chan struct{}) {
	var timer <-chan time.Time
	if d != forever {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-timer:
	case <-woken:
	case <-ctx.Done():
	}
}

// claimBatch is how many due records one claim looks at. A record found
// due may have been claimed or changed since the scan; the claim's CAS
// decides, and the next record is tried.
const claimBatch = 16

// claim is a claimed record; probe and fullProbe are its dial and room
// circuit probe tokens (0: not a probe); resync says the claim took its
// peer's summary exchange (takeResync), which the attempt must end
// (endResync).
type claim struct {
	rec       ledger.Record
	probe     uint64
	fullProbe uint64
	resync    bool
}

// release ends the claim's probes that did not decide their circuit.
func (c claim) release(e *Executor) {
	if c.probe != 0 {
		e.circuits.release(c.rec.PeerID, c.probe)
	}
	if c.fullProbe != 0 {
		e.full.release(c.rec.PeerID, c.fullProbe)
	}
}

// claimNext claims the first due record in ledger order whose peer's dial
// circuit admits it. Due records of peers whose circuit is open are
// deferred on the way (see circuit.go), so they neither block the scan
// nor cost a dial; the scan then goes on past them. Records of a peer
// whose summary exchange is under way are passed over (held reports
// that some were): the exchange settles what the peer holds, and offering
// them meanwhile is what it exists to avoid. A claim (not a probe) of a
// peer due a summary takes the exchange.
func (e *Executor) claimNext() (_ claim, ok, held bool, _ error) {
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	now := e.cfg.Now()
	skip := 0           // records of resyncing peers at the head of the due list
	batch := claimBatch // records looked at past them
	for {
		recs, err := e.led.Pending(now, skip+batch)
		if err != nil {
			return claim{}, false, false, err
		}
		var deferrals deferrals
		seen := 0
		for _, r := range recs {
			if e.resyncBusy(r.PeerID) {
				seen++
				continue
			}
			adm := e.circuits.admit(r.PeerID, now)
			if !adm.deferUntil.IsZero() {
				deferrals.add(r, adm.deferUntil)
				continue
			}
			room := e.full.admit(r.PeerID, now)
			c := claim{rec: r, probe: adm.probe, fullProbe: room.probe}
			if !room.deferUntil.IsZero() {
				c.release(e)
				deferrals.add(r, room.deferUntil)
				continue
			}
			got, ok, err := e.led.TryTransitionInflight(r.SegmentID, r.PeerID, now)
			if errors.Is(err, ledger.ErrIllegalTransition) || errors.Is(err, ledger.ErrNotFound) {
				err = nil // changed since the scan (operator action)
			}
			if err == nil && ok {
				if derr := e.applyDeferrals(deferrals, now); derr != nil {
					e.log.Error("relay deferral failed", "err", derr)
				}
				c.rec = got
				c.resync = c.probe == 0 && c.fullProbe == 0 && e.takeResync(got.PeerID)
				return c, true, false, nil
			}
			c.release(e)
			if err != nil {
				return claim{}, false, false, err
			}
		}
		if len(deferrals) == 0 {
			if seen > skip && len(recs) == skip+batch {
				// Look past the passed-over records, doubling the scan so
				// that a backlog of thousands costs a few scans, not one
				// per claimBatch.
				skip = max(seen, 2*skip+claimBatch)
				continue
			}
			return claim{}, false, seen > 0, nil
		}
		// Deferred records leave the due window (their new time is after
		// now), so the next scan sees records behind them.
		if err := e.applyDeferrals(deferrals, now); err != nil {
			return claim{}, false, false, err
		}
		// A scan that found nothing to claim doubles the next: the
		// backlog of a peer whose circuit opened is deferred in a few
		// transactions (one per claimBatch made 625 commits of 10,000
		// records of an unreachable peer, two fsyncs each).
		skip, batch = seen, min(2*batch, maxDeferScan)
	}
}

// maxDeferScan bounds the doubling scan of claimNext (the records one
// deferral transaction holds).
const maxDeferScan = 4096

// deferrals groups records to defer by their new due time (in practice
// one per peer with an open circuit).
type deferrals map[time.Time][]ledger.Pair

func (d *deferrals) add(r ledger.Record, until time.Time) {
	if *d == nil {
		*d = deferrals{}
	}
	(*d)[until] = append((*d)[until], ledger.Pair{SegmentID: r.SegmentID, PeerID: r.PeerID})
}

// applyDeferrals writes the deferrals, one transaction per due time.
//
// A verdict to defer was taken while the peer's circuit was open or its
// probe dialling; the probe's dial may have succeeded since, and
// backlogDue made the peer's backlog due. Written after that Expedite, a
// deferral would hold its records for up to a dial timeout, to be offered
// one by one instead of summarised (TestResyncAfterOfflineScale caught a
// dozen held segments offered 10 s late under load). So under deferMu,
// which backlogDue holds for its Expedite, the deferrals of a peer whose
// circuit has closed are dropped; those written before it closed are
// what the Expedite that follows brings back.
func (e *Executor) applyDeferrals(d deferrals, now time.Time) error {
	if len(d) == 0 {
		return nil // the common case: every claim passes here
	}
	e.deferMu.Lock()
	defer e.deferMu.Unlock()
	untils := make([]time.Time, 0, len(d))
	for u := range d {
		untils = append(untils, u)
	}
	sort.Slice(untils, func(i, j int) bool { return untils[i].Before(untils[j]) })
	for _, u := range untils {
		pairs := slices.DeleteFunc(d[u], func(p ledger.Pair) bool {
			return e.circuits.closed(p.PeerID) && e.full.closed(p.PeerID)
		})
		if len(pairs) == 0 {
			continue
		}
		moved, err := e.led.Defer(u, now, pairs...)
		if err != nil {
			return err
		}
		perPeer := map[string]int{}
		for _, p := range moved {
			perPeer[p.PeerID]++
		}
		for _, peer := range sortedKeys(perPeer) {
			e.log.Debug("relay deferred: dial circuit open", "peer", peer, "records", perPeer[peer], "until", u)
			if f := e.cfg.Observer.Deferred; f != nil {
				f(peer, perPeer[peer])
			}
		}
	}
	return nil
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// farFuture is later than any NextAttemptAfter.
var farFuture = time.Unix(0, 1<<62)

// nextDue returns the earliest NextAttemptAfter of any pending record.
func (e *Executor) nextDue() (time.Time, bool, error) {
	recs, err := e.led.Pending(farFuture, 1)
	if err != nil || len(recs) == 0 {
		return time.Time{}, false, err
	}
	return recs[0].NextAttemptAfter, true, nil
}

// errSegmentMissing: the record's segment is no longer stored.
var errSegmentMissing = errors.New("segment missing from local store")

// errUnknownPeer: the record's peer is not in known_peers (any more).
var errUnknownPeer = errors.New("peer not in known_peers")

// executeRelay runs one claimed attempt and records its outcome. On a
// version 2 connection it goes on to pipeline whatever else is due for
// the same peer (executeStream; not for a circuit probe: a probe is one
// attempt). soft is Run's context: once it is done no more is claimed;
// ctx bounds the attempts themselves.
func (e *Executor) executeRelay(soft, ctx context.Context, c claim) {
	rec := c.rec
	start := time.Now()
	conn, reused, err := e.prepare(ctx, rec)
	if err != nil {
		if c.resync {
			e.endResync(rec.PeerID, false)
		}
		e.finish(rec, 0, err, time.Since(start))
		return
	}
	if conn.Version() < wire.Version2 {
		if c.resync {
			e.endResync(rec.PeerID, true) // a version 1 peer has no summary
		}
		size, err := e.deliver(ctx, conn, reused, rec)
		e.finish(rec, size, err, time.Since(start))
		return
	}
	e.executeStream(soft, ctx, conn, reused, rec, c.probe != 0 || c.fullProbe != 0, c.resync)
}

// finish records one attempt's outcome: the ACK, or the failure.
func (e *Executor) finish(rec ledger.Record, size int64, err error, elapsed time.Duration) {
	now := e.cfg.Now()
	log := e.log.With("segment", rec.SegmentID, "peer", rec.PeerID, "attempt", rec.Attempts)
	if err == nil {
		if _, terr := e.led.TransitionAcked(rec.SegmentID, rec.PeerID, now); terr != nil {
			if cancelledMeanwhile(terr) {
				// Taken down here while this attempt ran, and its last
				// bytes had left before: the peer holds a copy. The
				// takedown owner learns it from the peer's own report.
				log.Warn("peer acknowledged a segment taken down here while it was being sent: the peer holds a copy", "bytes", size)
				return
			}
			// The peer holds the segment but the ledger could not say so;
			// the record stays Inflight and start-up reconciliation turns
			// it into a failed attempt, which resends (re-ACKed).
			log.Error("relay ack not recorded", "err", terr)
			return
		}
		e.observe(rec.PeerID, "acked", size, elapsed)
		log.Info("relay acked", "bytes", size, "duration", elapsed)
		e.roomOK(rec.PeerID)
		e.checkSuccessCondition(rec.SegmentID)
		return
	}
	e.failed(rec, err, elapsed)
}

// failed records a failed attempt (or deadletters a record whose segment
// is gone).
func (e *Executor) failed(rec ledger.Record, err error, elapsed time.Duration) {
	if refusedForRoom(err) {
		e.postpone(rec, err, elapsed)
		return
	}
	if refusedBusy(err) {
		e.postponeBusy(rec, err, elapsed)
		return
	}
	now := e.cfg.Now()
	log := e.log.With("segment", rec.SegmentID, "peer", rec.PeerID, "attempt", rec.Attempts)
	if refusedEvicted(err) {
		e.cancel(rec, err, elapsed)
		return
	}
	if errors.Is(err, errSegmentMissing) {
		// Deadletter now rather than spending the retry budget: the
		// source is gone and no retry can bring it back.
		n, perr := e.led.PruneMissing(func(id string) bool {
			if id != rec.SegmentID {
				return true
			}
			_, serr := e.store.Stat(id)
			return !errors.Is(serr, segstore.ErrNotFound)
		}, now)
		if perr == nil && n > 0 {
			e.observe(rec.PeerID, "deadletter", 0, elapsed)
			log.Error("relay deadlettered", "err", err)
			return
		}
	}
	r, terr := e.led.TransitionFailed(rec.SegmentID, rec.PeerID, err, now, e.cfg.Policy)
	if terr != nil {
		if cancelledMeanwhile(terr) {
			// Taken down here while this attempt ran (its read was cut,
			// or it found the segment gone): nothing to record.
			e.observe(rec.PeerID, "cancelled", 0, elapsed)
			log.Info("relay attempt ended: segment taken down here", "err", err)
			return
		}
		log.Error("relay failure not recorded", "err", err, "record_err", terr)
		return
	}
	if r.State == ledger.StateDeadletter {
		e.observe(rec.PeerID, "deadletter", 0, elapsed)
		log.Error("relay deadlettered", "err", err, "attempts_in_budget", r.BudgetUsed())
		// Under one_peer a deadlettered peer may have been the last
		// thing holding back eviction.
		e.checkSuccessCondition(rec.SegmentID)
		return
	}
	e.observe(rec.PeerID, "failed", 0, elapsed)
	log.Warn("relay attempt failed", "err", err, "next_attempt", r.NextAttemptAfter)
}

func (e *Executor) observe(peer, outcome string, bytes int64, d time.Duration) {
	if f := e.cfg.Observer.Attempt; f != nil {
		f(peer, outcome, bytes, d)
	}
}

// prepare finds the record's peer and segment and gets a connection
// (pooled or dialled). A segment no longer stored is errSegmentMissing,
// found before dialling.
func (e *Executor) prepare(ctx context.Context, rec ledger.Record) (*wire.Conn, bool, error) {
	addr, ok := e.cfg.Peers[rec.PeerID]
	if !ok {
		return nil, false, fmt.Errorf("deliver to %s: %w", rec.PeerID, errUnknownPeer)
	}
	if _, err := e.store.Stat(rec.SegmentID); err != nil {
		if errors.Is(err, segstore.ErrNotFound) {
			return nil, false, fmt.Errorf("deliver %s: %w", rec.SegmentID, errSegmentMissing)
		}
		return nil, false, fmt.Errorf("deliver %s: %w", rec.SegmentID, err)
	}
	return e.conn(ctx, rec.PeerID, addr)
}

// deliver sends the record's segment on a version 1 connection and waits
// for the ACK. It returns the segment size and nil only for a matching
// ACK. The connection goes back to the pool after success and is closed
// otherwise.
func (e *Executor) deliver(ctx context.Context, conn *wire.Conn, reused bool, rec ledger.Record) (int64, error) {
	f, entry, err := e.store.Open(rec.SegmentID)
	if errors.Is(err, segstore.ErrNotFound) {
		conn.Close()
		return 0, fmt.Errorf("deliver %s: %w", rec.SegmentID, errSegmentMissing)
	}
	if err != nil {
		conn.Close()
		return 0, fmt.Errorf("deliver %s: %w", rec.SegmentID, err)
	}
	defer f.Close()
	offer := wire.Offer{SegmentID: entry.ID, Size: entry.Size, SHA256: entry.SHA256}
	err = e.exchange(ctx, conn, offer, f)
	if err != nil && reused && staleConn(err) {
		// The pooled connection was dead before the peer saw our offer
		// (typically closed by its idle timeout): one fresh try.
		conn.Close()
		if _, serr := f.Seek(0, io.SeekStart); serr != nil {
			return 0, fmt.Errorf("deliver %s: rewind: %w", rec.SegmentID, serr)
		}
		if conn, err = e.dialPeer(ctx, rec.PeerID, e.cfg.Peers[rec.PeerID]); err != nil {
			return 0, err
		}
		if conn.Version() >= wire.Version2 {
			// The peer was upgraded meanwhile; the next attempt pipelines.
			conn.Close()
			return 0, fmt.Errorf("deliver %s: peer now speaks version %d: retry", rec.SegmentID, conn.Version())
		}
		err = e.exchange(ctx, conn, offer, f)
	}
	if err != nil {
		conn.Close()
		return 0, err
	}
	e.pool.put(rec.PeerID, conn)
	return entry.Size, nil
}

func (e *Executor) conn(ctx context.Context, peer, addr string) (*wire.Conn, bool, error) {
	if c := e.pool.get(peer); c != nil {
		return c, true, nil
	}
	c, err := e.dialPeer(ctx, peer, addr)
	return c, false, err
}

// dialPeer dials and reports the outcome to the peer's circuit, unless
// the dial was cut short because the agent is stopping (that says nothing
// about the peer).
func (e *Executor) dialPeer(ctx context.Context, peer, addr string) (*wire.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	c, err := e.dial.Dial(dctx, addr, peer)
	if err != nil && ctx.Err() != nil {
		return nil, err
	}
	back := e.circuits.dialed(peer, e.cfg.Now(), err)
	if err != nil {
		e.needResync(peer)
	}
	if back {
		e.backlogDue(peer, "reachable again")
	}
	if err == nil {
		e.log.Debug("relay connection", "peer", peer, "version", c.Version(), "peer_window", c.PeerWindow())
	}
	if f := e.cfg.Observer.Dialed; f != nil {
		f(peer, err)
	}
	return c, err
}

// nackGrace bounds the wait for a NACK after the segment write failed (a
// receiver may refuse and close before reading the segment).
const nackGrace = 2 * time.Second

// exchange is one OFFER, SEGMENT, reply. The reply wait is bounded by
// AckTimeout; a late ACK is a failed attempt.
func (e *Executor) exchange(ctx context.Context, c *wire.Conn, o wire.Offer, src io.Reader) error {
	if err := c.SendOffer(ctx, o); err != nil {
		return err
	}
	if err := c.SendSegment(ctx, o, src); err != nil {
		if errors.Is(err, wire.ErrSource) {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, nackGrace)
		defer cancel()
		var ne *wire.NackError
		if rerr := c.RecvAck(rctx, o.SegmentID); errors.As(rerr, &ne) {
			return fmt.Errorf("%w (segment write: %v)", ne, err)
		}
		return err
	}
	actx, cancel := context.WithTimeout(ctx, e.cfg.AckTimeout)
	defer cancel()
	err := c.RecvAck(actx, o.SegmentID)
	if err != nil && ctx.Err() == nil && (actx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded)) {
		return fmt.Errorf("no ACK within ack_timeout %v: %w", e.cfg.AckTimeout, err)
	}
	return err
}

// staleConn reports errors that show a pooled connection was already
// closed by the peer, as opposed to a refusal, a timeout or a local fault.
func staleConn(err error) bool {
	var ne *wire.NackError
	if errors.As(err, &ne) || errors.Is(err, wire.ErrAckMismatch) || errors.Is(err, wire.ErrSource) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || errors.Is(err, wire.ErrBroken)
}

// broadcast wakes every waiter: wait returns a channel that is closed at
// the next signal.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcast() broadcast { return broadcast{ch: make(chan struct{})} }

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcast) signal() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}
