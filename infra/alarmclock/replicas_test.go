package alarmclock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/alarmclock"
	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// Several clocks on one store, as `relay serve` replicas on one database
// are: the tests below run each case on the in-memory store, on
// PostgreSQL (pgtest; skipped with the install message when it is not
// installed, unless RELAY_REQUIRE_POSTGRES=1) and on DynamoDB (the
// in-process endpoint through the real SDK).

type shared struct {
	src, dst relaycore.Store
	index    relaycore.DueIndex
}

var storeSeq atomic.Int64

var stores = []struct {
	name string
	open func(t *testing.T) shared
}{
	{"mem", func(*testing.T) shared {
		src := mem.New(relaycore.Capabilities{})
		return shared{src, mem.New(relaycore.Capabilities{}), src}
	}},
	{"postgres", func(t *testing.T) shared {
		pool := pgtest.SharedDatabase(t)
		db, err := postgres.Open(t.Context(), pool, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		n := storeSeq.Add(1)
		src, dst := db.Store(fmt.Sprintf("src%d", n)), db.Store(fmt.Sprintf("dst%d", n))
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), `DELETE FROM relay_items WHERE store = ANY($1)`, []string{src.Name(), dst.Name()}); err != nil {
				t.Errorf("delete the test's items: %v", err)
			}
		})
		return shared{src, dst, src}
	}},
	{"dynamodb", func(t *testing.T) shared {
		client := dynamotest.Start(t).Client(nil)
		for _, tbl := range []string{"relay-source", "relay-target"} {
			if err := dynamo.CreateTable(t.Context(), client, tbl); err != nil {
				t.Fatal(err)
			}
		}
		src := dynamo.New(client, "relay-source", dynamo.Options{})
		return shared{src, dynamo.New(client, "relay-target", dynamo.Options{}), src}
	}},
}

// manualClock is the time every replica's handler and clock read; tests
// move it.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// replica is one process's clock and handler on the shared store.
type replica struct {
	name  string
	clock *alarmclock.Clock
	h     *relaycore.RelayHandler

	mu        sync.Mutex
	delivered map[relaycore.Partition]int // rows this replica delivered, per source
}

func (r *replica) deliveredBy() map[relaycore.Partition]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[relaycore.Partition]int{}
	for s, n := range r.delivered {
		out[s] = n
	}
	return out
}

const claimTTL = 10 * time.Second

// newReplicas starts n replicas' clocks (not running: the tests step them,
// or Run them) on s. wrap, when set, wraps replica i's target store.
// gatedReplicas is newReplicas whose replica 0 reaches the store through a
// gate, so a test can hold its fire mid-way.
func gatedReplicas(s shared, n int, clock relaycore.Clock, sweep time.Duration) ([]*replica, *gate) {
	g := newGate()
	rs := newReplicas(s, n, clock, sweep, func(i int, st relaycore.Store) relaycore.Store {
		if i == 0 {
			g.Store = st
			return g
		}
		return st
	}, nil)
	return rs, &g
}

func newReplicas(s shared, n int, clock relaycore.Clock, sweep time.Duration, wrap func(i int, st relaycore.Store) relaycore.Store, observed chan<- struct{}) []*replica {
	return newReplicasTTL(s, n, clock, sweep, claimTTL, wrap, observed)
}

func newReplicasTTL(s shared, n int, clock relaycore.Clock, sweep, ttl time.Duration, wrap func(i int, st relaycore.Store) relaycore.Store, observed chan<- struct{}) []*replica {
	var out []*replica
	for i := range n {
		dst := s.dst
		if wrap != nil {
			dst = wrap(i, dst)
		}
		r := &replica{name: fmt.Sprintf("r%d", i), delivered: map[relaycore.Partition]int{}}
		r.h = &relaycore.RelayHandler{Source: s.src, Target: dst, Clock: clock, ClaimTTL: ttl}
		r.clock = alarmclock.New(alarmclock.Config{
			Handler: r.h, Index: s.index, Source: s.src, Replica: r.name, Clock: clock, SweepInterval: sweep,
			Observe: func(src relaycore.Partition, res relaycore.AlarmResult, _ error) {
				r.mu.Lock()
				r.delivered[src] += res.RowsDelivered
				r.mu.Unlock()
				if observed != nil {
					select {
					case observed <- struct{}{}:
					default:
					}
				}
			},
		})
		r.h.Kicker = r.clock
		out = append(out, r)
	}
	return out
}

// stepAll runs the replicas' due wake-ups round-robin, one each in turn,
// until none is due on any.
func stepAll(ctx context.Context, rs ...*replica) {
	for {
		ran := false
		for _, r := range rs {
			ran = r.clock.RunNext(ctx) || ran
		}
		if !ran {
			return
		}
	}
}

func sourceName(i int) relaycore.Partition { return relaycore.Partition(fmt.Sprintf("s%02d", i)) }

// rowsFor are source's n rows, to two targets of its own.
func rowsFor(source relaycore.Partition, n int) []relaycore.Row {
	rows := make([]relaycore.Row, n)
	for i := range rows {
		rows[i] = relaycore.Row{
			Target: relaycore.Partition(fmt.Sprintf("%s.t%d", source, i%2)),
			Puts:   []relaycore.KV{{Key: fmt.Sprintf("k%d", i), Value: []byte(fmt.Sprintf("%s-%d", source, i))}},
		}
	}
	return rows
}

// checkDelivered fails unless each source's first n rows are at their
// targets with their values (a row is written once per key, so a value
// from another row or source would show).
func checkDelivered(t *testing.T, s shared, sources []relaycore.Partition, n int) {
	t.Helper()
	for _, src := range sources {
		for _, r := range rowsFor(src, n) {
			v, ok, err := s.dst.Get(t.Context(), r.Target, r.Puts[0].Key)
			if err != nil || !ok || string(v) != string(r.Puts[0].Value) {
				t.Fatalf("%s/%s = %q, %v, %v; want %q", r.Target, r.Puts[0].Key, v, ok, err, r.Puts[0].Value)
			}
		}
		st, err := relaycore.SourceRelayState(t.Context(), s.src, src, time.Now())
		if err != nil || !st.Empty {
			t.Fatalf("source %s not drained: %+v, %v", src, st, err)
		}
	}
}

func sum(rs []*replica, f func(alarmclock.Stats) int64) int64 {
	var n int64
	for _, r := range rs {
		n += f(r.clock.Stats())
	}
	return n
}

// Three replicas sweep the same due index at the same instant, each finding
// every source's overdue alarm (their kicks were lost: a process died
// after enqueuing). Each fires in its own order and checks a source before
// firing it, so every source is fired exactly once, by one replica, every
// replica fires some, and the other two pay one read each for it. Without
// the check each replica would fire all of them: 3 alarms per source,
// two of them finding nothing.
func TestReplicasShareTheSweep(t *testing.T) {
	const nSources, nRows = 24, 6
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t)
			ctx := t.Context()
			now := &manualClock{t: time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)}
			var sources []relaycore.Partition
			for i := range nSources {
				src := sourceName(i)
				sources = append(sources, src)
				h := &relaycore.RelayHandler{Source: s.src, Clock: now} // no kicker: lost
				if _, err := h.Enqueue(ctx, src, rowsFor(src, nRows), relaycore.EnqueueOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			now.Set(now.Now().Add(time.Second))
			rs := newReplicas(s, 3, now, time.Minute, nil, nil)
			for _, r := range rs {
				r.clock.SweepNow(ctx)
			}
			stepAll(ctx, rs...)
			checkDelivered(t, s, sources, nRows)

			for _, r := range rs {
				st := r.clock.Stats()
				t.Logf("%s: %d alarms, delivered %v; stats %+v", r.name, st.Alarms, r.deliveredBy(), st)
				if st.Alarms == 0 {
					t.Errorf("replica %s fired no source", r.name)
				}
				for src, n := range r.deliveredBy() {
					if n != nRows {
						t.Errorf("replica %s delivered %d rows of %s, want all %d (one alarm each)", r.name, n, src, nRows)
					}
				}
			}
			if got := sum(rs, func(s alarmclock.Stats) int64 { return s.Alarms }); got != nSources {
				t.Errorf("%d alarms in all, want %d: one per source", got, nSources)
			}
			if got := sum(rs, func(s alarmclock.Stats) int64 { return s.SkippedDone }); got != 2*nSources {
				t.Errorf("%d checks skipped a fired source, want %d (the two other replicas, once each)", got, 2*nSources)
			}
			if got := sum(rs, func(s alarmclock.Stats) int64 { return s.Busy }); got != 0 {
				t.Errorf("%d busy alarms, want 0", got)
			}
		})
	}
}

// gate holds replica 0's deliveries to source s00's targets: the fire is in
// flight, its claim live, until release says how it ends.
type gate struct {
	relaycore.Store
	entered chan struct{}
	once    *sync.Once
	release chan error
}

func (g gate) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if len(p) >= 4 && p[:4] == "s00." {
		g.once.Do(func() { close(g.entered) })
		select {
		case err := <-g.release:
			g.release <- err // every target of the fire gets the same
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Store.Apply(ctx, p, b)
}

func newGate() gate {
	return gate{entered: make(chan struct{}), once: &sync.Once{}, release: make(chan error, 1)}
}

var errKilled = errors.New("replica killed")

// Replica 0 takes six sources' kicks and dies (kill -9) while firing the
// first: its other five wake-ups were only in its memory, and its claim
// on s00 stays in the store. The two others' sweeps (1 s after the death,
// sweep period 4 s) fire the five at once and find s00 claimed;
// each looks again when the claim lapses, and one takes it over: every
// source is delivered within claim_ttl + the sweep period of the death,
// each by one replica, with no busy alarm.
func TestReplicaDiesOthersTakeOver(t *testing.T) {
	const nSources, nRows = 6, 4
	const sweep = 4 * time.Second
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t)
			ctx := t.Context()
			t0 := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
			now := &manualClock{t: t0}
			rs, g := gatedReplicas(s, 3, now, sweep)
			var sources []relaycore.Partition
			for i := range nSources {
				src := sourceName(i)
				sources = append(sources, src)
				if _, err := rs[0].h.Enqueue(ctx, src, rowsFor(src, nRows), relaycore.EnqueueOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			dead := make(chan struct{})
			go func() {
				defer close(dead)
				rs[0].clock.RunNext(ctx) // s00: the earliest kick
			}()
			<-g.entered // r0 is mid-fire on s00, and never steps again

			now.Set(t0.Add(time.Second)) // the others' next sweep
			rs[1].clock.SweepNow(ctx)
			rs[2].clock.SweepNow(ctx)
			stepAll(ctx, rs[1], rs[2])
			checkDelivered(t, s, sources[1:], nRows)
			if _, ok, err := s.dst.Get(ctx, "s00.t0", "k0"); ok || err != nil {
				t.Fatalf("s00 delivered while its dead claim was live: %v, %v", ok, err)
			}
			for _, r := range rs[1:] {
				if due, ok := r.clock.NextDue(); !ok || due != t0.Add(claimTTL).UnixMilli() {
					t.Fatalf("%s: next wake-up %d, %v; want s00's claim lapse at %d", r.name, due, ok, t0.Add(claimTTL).UnixMilli())
				}
			}

			now.Set(t0.Add(claimTTL)) // <= claim_ttl + sweep period after the death
			stepAll(ctx, rs[1], rs[2])
			checkDelivered(t, s, sources, nRows)

			g.release <- errKilled // what r0 would still have done never lands
			<-dead
			checkDelivered(t, s, sources, nRows)
			live := rs[1:]
			for _, r := range live {
				t.Logf("%s: delivered %v; stats %+v", r.name, r.deliveredBy(), r.clock.Stats())
				if r.clock.Stats().Alarms == 0 {
					t.Errorf("replica %s fired no source", r.name)
				}
			}
			if got := sum(live, func(s alarmclock.Stats) int64 { return s.Alarms }); got != nSources {
				t.Errorf("%d alarms on the live replicas, want %d: one per source", got, nSources)
			}
			if got := sum(live, func(s alarmclock.Stats) int64 { return s.Busy }); got != 0 {
				t.Errorf("%d busy alarms, want 0", got)
			}
			if got := sum(live, func(s alarmclock.Stats) int64 { return s.SkippedClaimed }); got != 2 {
				t.Errorf("%d checks met s00's dead claim, want 2 (each live replica's sweep)", got)
			}
			if got := sum(live, func(s alarmclock.Stats) int64 { return s.SkippedDone }); got != nSources {
				t.Errorf("%d checks found a source fired by the other replica, want %d (one per source)", got, nSources)
			}
		})
	}
}

// A source another replica is firing is left to it: the sweep's check
// meets the live claim and looks once more when it lapses. If the holder
// finished meanwhile, that look finds nothing to do; if it holds the
// source again (alive, firing anew), the look drops the wake-up, so a busy
// source costs a replica two reads per sweep, not one per claim_ttl.
func TestClaimedSourceLeftToItsHolder(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			for _, holdAgain := range []bool{false, true} {
				s := st.open(t)
				ctx := t.Context()
				t0 := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
				now := &manualClock{t: t0}
				rs, g := gatedReplicas(s, 2, now, time.Minute)
				src := sourceName(0)
				if _, err := rs[0].h.Enqueue(ctx, src, rowsFor(src, 4), relaycore.EnqueueOptions{}); err != nil {
					t.Fatal(err)
				}
				held := make(chan struct{})
				go func() {
					defer close(held)
					rs[0].clock.RunNext(ctx)
				}()
				<-g.entered
				now.Set(t0.Add(time.Second))
				rs[1].clock.SweepNow(ctx)
				stepAll(ctx, rs[1])
				g.release <- nil
				<-held
				<-g.release
				checkDelivered(t, s, []relaycore.Partition{src}, 4)
				if holdAgain {
					// r0 is at work on s00 again when r1 looks.
					if _, err := rs[0].h.Enqueue(ctx, src, rowsFor(src, 8)[4:], relaycore.EnqueueOptions{}); err != nil {
						t.Fatal(err)
					}
					now.Set(t0.Add(claimTTL - time.Second))
					g.entered, g.once = make(chan struct{}), &sync.Once{}
					rs[0].h.Target = g
					held = make(chan struct{})
					go func() {
						defer close(held)
						rs[0].clock.RunNext(ctx)
					}()
					<-g.entered
				}
				now.Set(t0.Add(claimTTL))
				stepAll(ctx, rs[1])
				st := rs[1].clock.Stats()
				t.Logf("hold again %v: r1 stats %+v", holdAgain, st)
				if st.Alarms != 0 || st.Busy != 0 {
					t.Errorf("hold again %v: r1 ran %d alarms (%d busy), want none", holdAgain, st.Alarms, st.Busy)
				}
				wantSkips := alarmclock.Stats{SkippedClaimed: 1, SkippedDone: 1}
				if holdAgain {
					wantSkips = alarmclock.Stats{SkippedClaimed: 2}
				}
				if st.SkippedClaimed != wantSkips.SkippedClaimed || st.SkippedDone != wantSkips.SkippedDone {
					t.Errorf("hold again %v: skipped %d claimed, %d done; want %d, %d", holdAgain, st.SkippedClaimed, st.SkippedDone, wantSkips.SkippedClaimed, wantSkips.SkippedDone)
				}
				if due, ok := rs[1].clock.NextDue(); ok {
					t.Errorf("hold again %v: r1 still has a wake-up at %d", holdAgain, due)
				}
				if holdAgain {
					g.release <- nil
					<-held
					stepAll(ctx, rs[0])
					checkDelivered(t, s, []relaycore.Partition{src}, 8)
				}
			}
		})
	}
}

// Three replicas' clocks run on real time against one store while four
// writers enqueue through all of them at random (seeded; the seed is
// logged): every row arrives, every replica fires, and the busy alarms
// (fires that met another replica's claim) are counted.
func TestReplicasRunTogether(t *testing.T) {
	const nSources, writers, batches, perBatch = 9, 4, 12, 5
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t)
			seed := time.Now().UnixNano()
			t.Logf("seed %d", seed)
			observed := make(chan struct{}, 1)
			rs := newReplicas(s, 3, relaycore.SystemClock{}, 50*time.Millisecond, nil, observed)
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			for _, r := range rs {
				wg.Go(func() { r.clock.Run(ctx) })
			}
			defer func() { cancel(); wg.Wait() }()

			var sources []relaycore.Partition
			want := map[relaycore.Partition][]relaycore.Row{}
			var mu sync.Mutex
			enqueue := func(r *replica, src relaycore.Partition, rows []relaycore.Row) {
				if _, err := r.h.Enqueue(ctx, src, rows, relaycore.EnqueueOptions{}); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				want[src] = append(want[src], rows...)
				mu.Unlock()
			}
			batch := func(src relaycore.Partition, tag string) []relaycore.Row {
				rows := make([]relaycore.Row, perBatch)
				for i := range rows {
					k := fmt.Sprintf("%s-%d", tag, i)
					rows[i] = relaycore.Row{Target: relaycore.Partition(fmt.Sprintf("%s.t%d", src, i%2)), Puts: []relaycore.KV{{Key: k, Value: []byte(k)}}}
				}
				return rows
			}
			// Each replica takes the first kicks of three sources.
			for i := range nSources {
				src := sourceName(i)
				sources = append(sources, src)
				enqueue(rs[i%3], src, batch(src, "first"))
			}
			var ww sync.WaitGroup
			for w := range writers {
				ww.Go(func() {
					rnd := newRand(seed + int64(w))
					for b := range batches {
						src := sources[rnd.IntN(nSources)]
						enqueue(rs[rnd.IntN(len(rs))], src, batch(src, fmt.Sprintf("w%d-b%d", w, b)))
					}
				})
			}
			ww.Wait()

			guard, stop := context.WithTimeout(ctx, time.Minute) // a hang, not a timing assertion
			defer stop()
			for drained := false; !drained; {
				drained = true
				for _, src := range sources {
					st, err := relaycore.SourceRelayState(guard, s.src, src, time.Now())
					if err != nil {
						t.Fatal(err)
					}
					drained = drained && st.Empty
				}
				if !drained {
					select {
					case <-observed:
					case <-guard.Done():
						t.Fatalf("outboxes not drained (seed %d)", seed)
					}
				}
			}
			for src, rows := range want {
				for _, r := range rows {
					v, ok, err := s.dst.Get(ctx, r.Target, r.Puts[0].Key)
					if err != nil || !ok || string(v) != string(r.Puts[0].Value) {
						t.Fatalf("%s: %s/%s = %q, %v, %v (seed %d)", src, r.Target, r.Puts[0].Key, v, ok, err, seed)
					}
				}
			}
			for _, r := range rs {
				st := r.clock.Stats()
				t.Logf("%s: delivered %v; stats %+v", r.name, r.deliveredBy(), st)
				if st.Alarms == 0 {
					t.Errorf("replica %s ran no alarm (seed %d)", r.name, seed)
				}
			}
		})
	}
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewPCG(uint64(seed), 0)) }

// A kick meeting another replica's live claim (an enqueue through r1 while
// r0 fires the source) is one busy alarm, whose retry at the claim's lapse
// is checked: r0 holding the source again by then means it is alive, so
// r1 drops the wake-up instead of meeting a claim every claim_ttl.
func TestBusyKickRetriedOnceChecked(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t)
			ctx := t.Context()
			t0 := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
			now := &manualClock{t: t0}
			rs, g := gatedReplicas(s, 2, now, time.Hour)
			src := sourceName(0)
			hold := func() chan struct{} { // r0 fires src and holds it at the gate
				held := make(chan struct{})
				go func() {
					defer close(held)
					rs[0].clock.RunNext(ctx)
				}()
				<-g.entered
				return held
			}
			if _, err := rs[0].h.Enqueue(ctx, src, rowsFor(src, 4), relaycore.EnqueueOptions{}); err != nil {
				t.Fatal(err)
			}
			held := hold()
			// An enqueue through r1 whose kick is sent: force one with a
			// direct Kick (the engine sends none while it sees the claim).
			if err := rs[1].clock.Kick(ctx, src, t0.UnixMilli()); err != nil {
				t.Fatal(err)
			}
			rs[1].clock.RunNext(ctx)
			if st := rs[1].clock.Stats(); st.Busy != 1 || st.Alarms != 1 {
				t.Fatalf("r1 after its kick: %+v; want one busy alarm", st)
			}
			lapse := t0.Add(claimTTL).UnixMilli()
			if due, ok := rs[1].clock.NextDue(); !ok || due != lapse {
				t.Fatalf("r1's next wake-up %d, %v; want the claim's lapse %d", due, ok, lapse)
			}
			g.release <- nil
			<-held
			<-g.release
			// r0 at work on the source again when r1's retry comes.
			if _, err := rs[0].h.Enqueue(ctx, src, rowsFor(src, 8)[4:], relaycore.EnqueueOptions{}); err != nil {
				t.Fatal(err)
			}
			now.Set(t0.Add(claimTTL - time.Second))
			g.entered, g.once = make(chan struct{}), &sync.Once{}
			rs[0].h.Target = g
			held = hold()
			now.Set(t0.Add(claimTTL))
			stepAll(ctx, rs[1])
			if st := rs[1].clock.Stats(); st.Alarms != 1 || st.Busy != 1 || st.SkippedClaimed != 1 {
				t.Fatalf("r1 after the retry: %+v; want the retry checked and left to r0 (no second alarm)", st)
			}
			if due, ok := rs[1].clock.NextDue(); ok {
				t.Fatalf("r1 still has a wake-up at %d", due)
			}
			g.release <- nil
			<-held
			stepAll(ctx, rs[0])
			checkDelivered(t, s, []relaycore.Partition{src}, 8)
		})
	}
}
