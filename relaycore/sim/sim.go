package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/relay-dev/relay/relaycore"
)

// Stores are the two raw stores of a run: sources live in Source, targets in
// Target (the engine's RelayHandler takes them separately). The simulation
// owns them for the run; actors reach them only through the gate.
type Stores struct {
	Source, Target relaycore.Store
}

// Config is one run.
type Config struct {
	// Seed picks the scenario and every scheduling decision.
	Seed uint64
	// Steps is the chaos budget in store calls; after it the run quiesces
	// (writers stop, faults heal, fires drain the outboxes).
	Steps int
	// Open returns fresh, empty stores that enforce the scenario's limits
	// (Scenario.SourceLimits / TargetLimits), and a function that releases
	// them. Shrinking calls it once per re-run.
	Open func(sc *Scenario) (Stores, func(), error)
	// Trace records one line per store call in Result.Trace.
	Trace bool
	// QueryEvery runs the query checks (SourceRelayState,
	// RelayDeliveredThrough against the outbox) after every QueryEvery-th
	// source change instead of every one (0 or 1: every one). Quiescence
	// checks them all regardless. Slow stores (dynamo over HTTP) use it;
	// the other invariants are checked after every call always.
	QueryEvery int
	// NoBulk leaves bulk scenarios out (Scenario.Bulk): each seed then
	// replays the scenario it made before they existed, as the regression
	// seeds found before them need.
	NoBulk bool
	// NoWide leaves wide scenarios out (Scenario.Wide): the slow stores'
	// runs use it, since the engine's blocked set does not depend on the
	// store and a wide seed costs 4 chaos budgets.
	NoWide bool
	// DropWriters removes writers by index (shrinking uses it).
	DropWriters map[int]bool
	// Sabotage, when set, is called after store call number SabotageAt
	// with the raw stores; whatever it writes is checked like an actor's
	// step. It exists so the checker's self-test can prove that a broken
	// step is reported.
	Sabotage   func(ctx context.Context, raw Stores) string
	SabotageAt int
}

// Violation is one broken invariant.
type Violation struct {
	Call int // store call after which it was found (0: at quiescence)
	Text string
}

func (v Violation) String() string {
	if v.Call == 0 {
		return "at quiescence: " + v.Text
	}
	return fmt.Sprintf("after call %d: %s", v.Call, v.Text)
}

// Result counts a run.
type Result struct {
	Seed          uint64
	Scenario      string
	Steps         int // scheduler decisions (store calls, wake-ups, spawns)
	Calls         int // store calls through the gate
	Crashes       int
	Ambiguous     int // calls answered with ErrMaybeApplied
	TargetErrors  int // injected failures: target outages and failed reads
	Committed     int // rows committed to outboxes
	Delivered     int // rows applied at targets (rh advances)
	Batches       int // target batches committed
	Violations    []Violation
	Trace         []string
	ChaosCalls    int // calls made before quiescence began
	QuiesceRounds int

	// Checkpoints counts fire checkpoints that deleted or rewrote pages;
	// Rewrites those that rewrote two or more partly delivered pages;
	// NearLimit those of them whose page writes fill at least half the
	// room the engine keeps beside rs (the source's MaxBatchBytes less the
	// largest rs): the checkpoints where that room is tested (invariant 9
	// in docs/simulation.md).
	Checkpoints, Rewrites, NearLimit int
	// LoosePages counts the pages Loose scenarios' fires and claims asked
	// to delete loosely (relaycore.LooseDeleter), after a checkpoint listed
	// them in rs.gone.
	LoosePages int

	// OpActions counts operator actions tried; OpApplied those that took
	// effect (quarantine, pause, release, resume, skip); Skipped the rows
	// skipped into the archive; Held rows moved aside by fires.
	OpActions, OpApplied, Skipped int
	// Collected counts idle targets whose figures alarms collected.
	Collected int
	// Requeued counts rows that requeues of archive entries committed.
	Requeued int
	// BlockedFull counts source checks that found the blocked set full
	// (wide scenarios bring it there).
	BlockedFull int
}

// Failed reports whether any invariant broke.
func (r Result) Failed() bool { return len(r.Violations) > 0 }

type phase int

const (
	chaos   phase = iota // writers, fires, faults, crashes
	quiesce              // no new faults; running actors finish
	drain                // the drainer fires until idle
	done
)

// simulation is one run's state. Everything here is touched by exactly one
// goroutine at a time: the scheduler, or the one actor it resumed (the
// channel hand-offs order them), so no mutex is needed.
type simulation struct {
	ctx  context.Context
	cfg  Config
	sc   *Scenario
	rng  *rand.Rand
	raw  Stores
	now  int64
	ph   phase
	res  *Result
	chk  *checker
	evts chan event

	actors   []*actor
	nextID   int
	kicks    []kick
	kickSeen map[kick]bool
	sweepAt  int64
	restarts []restart
	drained  bool
}

type kick struct {
	source relaycore.Partition
	due    int64
}

type restart struct {
	at   int64
	plan *writerPlan
	inc  int
}

const (
	epochMS       = 1_800_000_000_000
	maxActors     = 14
	quiesceFactor = 30 // quiescence may take this many times the chaos budget (plus a constant)
)

// Run executes one simulation and reports what it found. It never fails
// the caller; violations are in the result.
func Run(ctx context.Context, cfg Config) Result {
	sc := newScenario(cfg.Seed, cfg.NoBulk, cfg.NoWide)
	res := &Result{Seed: cfg.Seed, Scenario: sc.String()}
	stores, release, err := cfg.Open(sc)
	if err != nil {
		res.Violations = append(res.Violations, Violation{Text: fmt.Sprintf("open stores: %v", err)})
		return *res
	}
	defer release()
	s := &simulation{
		ctx: ctx, cfg: cfg, sc: sc, raw: stores, res: res,
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0xc0ffee)),
		now:      epochMS,
		evts:     make(chan event),
		kickSeen: map[kick]bool{},
	}
	s.chk = newChecker(s)
	s.run()
	return *res
}

func (s *simulation) violate(format string, args ...any) {
	s.res.Violations = append(s.res.Violations, Violation{Call: s.res.Calls, Text: fmt.Sprintf(format, args...)})
}

func (s *simulation) tracef(format string, args ...any) {
	if s.cfg.Trace {
		s.res.Trace = append(s.res.Trace, fmt.Sprintf("%5d t=%8.3fs ", s.res.Calls, float64(s.now-epochMS)/1000)+fmt.Sprintf(format, args...))
	}
}

func (s *simulation) chance(perMille int) bool { return perMille > 0 && s.rng.IntN(1000) < perMille }

func (s *simulation) run() {
	defer s.killAll()
	defer func() {
		if s.ph == chaos {
			s.res.ChaosCalls = s.res.Calls
		}
	}()
	if err := s.chk.start(); err != nil {
		s.violate("initial check: %v", err)
		return
	}
	for i, wp := range s.sc.writers {
		if !s.cfg.DropWriters[i] {
			s.spawnWriter(wp, 0)
		}
	}
	if s.sc.LeaseSource != "" {
		s.spawn(&actor{kind: kindDeclare, name: "declare", source: s.sc.LeaseSource})
	}
	s.sweepAt = s.now + 1000
	chaosCalls := s.cfg.Steps * s.sc.chaosFactor()
	limit := chaosCalls*quiesceFactor + 20000
	for s.ph != done && len(s.res.Violations) == 0 {
		if s.res.Steps > limit {
			s.violate("no quiescence after %d steps (phase %d, %d live actors)", s.res.Steps, s.ph, s.live())
			return
		}
		s.res.Steps++
		if s.ph == chaos && s.res.Calls >= chaosCalls {
			s.enterQuiesce()
		}
		s.environment()
		runnable := s.runnable()
		if len(runnable) == 0 {
			if !s.idleAdvance() {
				s.nextPhase()
			}
			continue
		}
		a := runnable[s.rng.IntN(len(runnable))]
		if a.state == sleeping {
			a.state = running
			s.resume(a, decision{})
			continue
		}
		s.step(a)
		if s.cfg.Sabotage != nil && s.res.Calls == s.cfg.SabotageAt {
			what := s.cfg.Sabotage(s.ctx, s.raw)
			s.tracef("SABOTAGE %s", what)
			s.chk.afterSabotage()
		}
		s.now += int64(s.rng.IntN(40))
		if s.ph == chaos && s.rng.IntN(60) == 0 {
			s.now += 1000 + int64(s.rng.IntN(7000))
		}
	}
}

// environment plays the world outside the engine: kick deliveries, the
// sweeper, overlapping fires, restarts of crashed writers.
func (s *simulation) environment() {
	if s.ph != chaos {
		return
	}
	for len(s.kicks) > 0 && s.kicks[0].due <= s.now {
		k := s.kicks[0]
		s.kicks = s.kicks[1:]
		s.spawnAlarm(k.source, "kick")
		if s.rng.IntN(100) < s.sc.kickDupPer100 {
			s.spawnAlarm(k.source, "kick-dup")
		}
	}
	if s.now >= s.sweepAt {
		s.sweepAt = s.now + 300 + int64(s.rng.IntN(1200))
		for _, src := range s.sc.Sources {
			if a := s.chk.src[src].view.Alarm; a != nil && a.DueMS <= s.now {
				s.spawnAlarm(src, "sweep")
			}
		}
	}
	if s.chance(s.sc.opPer1000) && s.live() < maxActors {
		src := s.sc.Sources[s.rng.IntN(len(s.sc.Sources))]
		s.spawn(&actor{kind: kindOperator, name: "op", source: src})
	}
	if s.chance(s.sc.firePer1000) {
		src := s.sc.Sources[s.rng.IntN(len(s.sc.Sources))]
		if s.fires(src) < s.sc.maxFiresPerSource+1 && s.live() < maxActors {
			s.spawn(&actor{kind: kindFire, name: "fire", source: src})
		}
	}
	for i := 0; i < len(s.restarts); {
		r := s.restarts[i]
		if r.at > s.now {
			i++
			continue
		}
		s.restarts = slices.Delete(s.restarts, i, i+1)
		s.spawnWriter(r.plan, r.inc)
	}
}

func (s *simulation) spawnAlarm(src relaycore.Partition, why string) {
	if s.fires(src) >= s.sc.maxFiresPerSource || s.live() >= maxActors {
		return
	}
	s.spawn(&actor{kind: kindAlarm, name: "alarm/" + why, source: src})
}

func (s *simulation) fires(src relaycore.Partition) int {
	n := 0
	for _, a := range s.actors {
		if a.source == src && (a.kind == kindAlarm || a.kind == kindFire) && a.state != finished {
			n++
		}
	}
	return n
}

func (s *simulation) live() int {
	n := 0
	for _, a := range s.actors {
		if a.state != finished {
			n++
		}
	}
	return n
}

func (s *simulation) runnable() []*actor {
	var out []*actor
	for _, a := range s.actors {
		if a.state == parked || (a.state == sleeping && a.wakeAt <= s.now) {
			out = append(out, a)
		}
	}
	return out
}

// idleAdvance moves the clock to the next thing that can happen when no
// actor can run now. It reports false when nothing is pending at all.
func (s *simulation) idleAdvance() bool {
	next := int64(-1)
	consider := func(t int64) {
		if next < 0 || t < next {
			next = t
		}
	}
	for _, a := range s.actors {
		if a.state == sleeping {
			consider(a.wakeAt)
		}
	}
	if s.ph == chaos {
		for _, r := range s.restarts {
			consider(r.at)
		}
		if len(s.kicks) > 0 {
			consider(s.kicks[0].due)
		}
		if s.pendingAlarm() {
			consider(s.sweepAt)
		}
	}
	if next < 0 {
		return false
	}
	s.now = max(s.now, next)
	return true
}

func (s *simulation) pendingAlarm() bool {
	for _, src := range s.sc.Sources {
		if s.chk.src[src].view.Alarm != nil {
			return true
		}
	}
	return false
}

func (s *simulation) enterQuiesce() {
	s.ph = quiesce
	s.res.ChaosCalls = s.res.Calls
	s.tracef("QUIESCE: writers stop after their current call; faults stop; outages heal except permanent ones")
}

func (s *simulation) nextPhase() {
	switch s.ph {
	case chaos:
		s.enterQuiesce()
	case quiesce:
		s.ph = drain
		s.tracef("DRAIN: one drainer fires every source until only permanently failing targets' rows remain")
		s.spawn(&actor{kind: kindDrain, name: "drainer"})
	case drain:
		s.chk.quiescence()
		s.ph = done
	}
}

// targetDown reports whether an injected failure answers this target call.
func (s *simulation) targetDown(t relaycore.Partition) bool {
	f := s.sc.failures[t]
	switch f.kind {
	case transient:
		return s.ph == chaos && s.rng.IntN(100) < f.per100
	case outage:
		if f.heal < 0 {
			return s.res.Calls >= f.from || s.ph != chaos
		}
		return s.ph == chaos && s.res.Calls >= f.from && s.res.Calls < f.heal
	}
	return false
}

// permanentlyDown is a target that never heals.
func (s *simulation) permanentlyDown(t relaycore.Partition) bool {
	f := s.sc.failures[t]
	return f.kind == outage && f.heal < 0
}

var (
	errTargetDown = errors.New("sim: target unavailable (surely not applied)")
	errLost       = fmt.Errorf("sim: response lost: %w", relaycore.ErrMaybeApplied)
	errReadFailed = errors.New("sim: read timed out")
)

// step runs one store call of actor a: fault injection, the call on the
// raw store, the invariant checks, then hands the result back (or kills a).
func (s *simulation) step(a *actor) {
	req := a.req
	a.req = nil
	s.res.Calls++
	st := s.raw.Source
	if req.target {
		st = s.raw.Target
	}
	crashable := s.ph == chaos && a.kind != kindDrain
	if crashable && s.chance(s.sc.crashPer1000) && s.rng.IntN(2) == 0 {
		s.res.Crashes++
		s.tracef("%-14s %s -> CRASH before the call", a.name, req)
		s.kill(a)
		return
	}
	var r result
	how := ""
	changed := false // the call may have changed the store
	switch {
	case req.target && s.targetDown(req.p):
		s.res.TargetErrors++
		r.err = errTargetDown
		how = "target down"
	case req.op != opApply && s.ph == chaos && s.chance(s.sc.ambiguousPer1000/2):
		s.res.TargetErrors++
		r.err = errReadFailed
		how = "READ FAILED"
	case req.op == opDeleteLoose && s.ph == chaos && s.chance(s.sc.ambiguousPer1000):
		// Some deletes landed, then the call failed.
		n := s.rng.IntN(len(req.keys) + 1)
		r.err = errors.Join(deleteEach(s.ctx, st, req.p, req.keys[:n]), errLost)
		how = fmt.Sprintf("FAILED after deleting %d of %d", n, len(req.keys))
		changed = n > 0
	case req.op == opApply && s.ph == chaos && s.chance(s.sc.ambiguousPer1000):
		s.res.Ambiguous++
		if s.rng.IntN(2) == 0 {
			err := st.Apply(s.ctx, req.p, req.batch)
			how = "AMBIGUOUS (applied: " + outcome(err) + ")"
			changed = true
		} else {
			how = "AMBIGUOUS (not applied)"
		}
		r.err = errLost
	default:
		switch req.op {
		case opGet:
			r.val, r.found, r.err = st.Get(s.ctx, req.p, req.key)
			how = "missing"
			if r.found {
				how = "found"
			}
		case opGetMany:
			r.vals, r.err = relaycore.GetMany(s.ctx, st, req.p, req.keys)
			how = fmt.Sprintf("%d of %d found", len(r.vals), len(req.keys))
		case opScan:
			r.page, r.err = st.Scan(s.ctx, req.p, req.scan)
			how = fmt.Sprintf("%d items next=%q", len(r.page.Items), r.page.Next)
		case opApply:
			r.err = st.Apply(s.ctx, req.p, req.batch)
			how = outcome(r.err)
			_, cond := relaycore.FailedPrecondition(r.err)
			changed = !cond
		case opDeleteLoose:
			s.res.LoosePages += len(req.keys)
			r.err = deleteEach(s.ctx, st, req.p, req.keys)
			how = outcome(r.err)
			changed = true
		}
		if r.err != nil && req.op != opApply {
			how = "error: " + r.err.Error()
		}
	}
	crashAfter := crashable && s.chance(s.sc.crashPer1000)
	if crashAfter {
		s.res.Crashes++
		how += " -> CRASH after the call"
	}
	s.tracef("%-14s %s -> %s", a.name, req, how)
	if changed {
		if req.target {
			s.chk.afterTarget(a, req)
		} else {
			s.chk.afterSource(a, req)
		}
	}
	if crashAfter {
		s.kill(a)
		return
	}
	a.state = running
	s.resume(a, decision{res: r})
}

// deleteEach deletes keys loosely on the raw store: with its own
// DeleteLoose when it has one (infra/dynamo), else one batch per key.
func deleteEach(ctx context.Context, st relaycore.Store, p relaycore.Partition, keys []string) error {
	if ld, ok := st.(relaycore.LooseDeleter); ok {
		return ld.DeleteLoose(ctx, p, keys)
	}
	for _, k := range keys {
		if err := st.Apply(ctx, p, relaycore.Batch{Writes: []relaycore.Write{{Key: k, Delete: true}}}); err != nil {
			return err
		}
	}
	return nil
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	if i, ok := relaycore.FailedPrecondition(err); ok {
		return fmt.Sprintf("precondition %d failed", i)
	}
	return "error: " + err.Error()
}

// kill ends a (process death): it never runs again and nothing it knew
// survives. A crashed writer's workload is picked up later by a fresh
// writer; crashed fires are replaced by the sweeper.
func (s *simulation) kill(a *actor) {
	a.dead = true
	a.state = running
	s.resume(a, decision{die: true})
	if a.plan != nil && s.ph == chaos {
		s.restarts = append(s.restarts, restart{at: s.now + 200 + int64(s.rng.IntN(4000)), plan: a.plan, inc: a.inc + 1})
	}
}

// killAll ends every actor still alive (a violation stopped the run).
func (s *simulation) killAll() {
	for _, a := range s.actors {
		if a.state == parked || a.state == sleeping {
			a.dead = true
			a.state = running
			s.resume(a, decision{die: true})
		}
	}
}

// resume hands control to a and waits until it parks again (next store
// call or sleep) or finishes.
func (s *simulation) resume(a *actor, d decision) {
	a.resumedAt = s.now
	a.resume <- d
	s.await(a)
}

func (s *simulation) await(a *actor) {
	ev := <-s.evts
	if ev.a != a {
		panic(fmt.Sprintf("sim: event from %s while %s runs", ev.a.name, a.name))
	}
	switch {
	case ev.done:
		a.state = finished
		if ev.panicked != nil {
			s.violate("actor %s panicked: %v\n%s", a.name, ev.panicked, ev.stack)
		}
	case ev.req != nil:
		a.state, a.req = parked, ev.req
	default:
		a.state, a.wakeAt = sleeping, ev.wakeAt
	}
}

func (s *simulation) spawnWriter(wp *writerPlan, inc int) {
	if wp.next >= len(wp.batches) || s.ph != chaos {
		return
	}
	kind := kindWriter
	if wp.lease {
		kind = kindLeaseWriter
	}
	name := wp.name
	if inc > 0 {
		name = fmt.Sprintf("%s#%d", wp.name, inc)
	}
	s.spawn(&actor{kind: kind, name: name, source: wp.source, plan: wp, inc: inc})
}

// spawn starts a and lets it run to its first park.
func (s *simulation) spawn(a *actor) {
	s.nextID++
	a.id = s.nextID
	a.sim = s
	a.resume = make(chan decision)
	if s.sc.maxSkewMS > 0 && a.kind != kindDrain {
		a.skewMS = s.rng.Int64N(2*s.sc.maxSkewMS+1) - s.sc.maxSkewMS
	}
	a.startCall = s.res.Calls
	a.name = fmt.Sprintf("%s.%d", a.name, a.id)
	if a.source != "" {
		a.name += "@" + string(a.source)
	}
	s.actors = append(s.actors, a)
	s.tracef("SPAWN %s (skew %+dms)", a.name, a.skewMS)
	a.state = running
	a.resumedAt = s.now
	go a.main()
	s.await(a)
}

// request is one store call an actor wants to make.
type request struct {
	op     opKind
	target bool
	p      relaycore.Partition
	key    string
	keys   []string // opGetMany
	scan   relaycore.ScanRequest
	batch  relaycore.Batch
}

type opKind int

const (
	opGet opKind = iota
	opScan
	opApply
	opGetMany
	opDeleteLoose
)

func (r *request) String() string {
	side := "src"
	if r.target {
		side = "tgt"
	}
	switch r.op {
	case opGet:
		return fmt.Sprintf("get   %s %s %s", side, r.p, r.key)
	case opGetMany:
		keys := r.keys
		more := ""
		if len(keys) > 8 {
			keys, more = keys[:8], fmt.Sprintf(",…+%d", len(r.keys)-8)
		}
		return fmt.Sprintf("getm  %s %s %s%s", side, r.p, strings.Join(keys, ","), more)
	case opScan:
		return fmt.Sprintf("scan  %s %s [%q,%q) after %q limit %d", side, r.p, r.scan.Start, r.scan.End, r.scan.After, r.scan.Limit)
	case opDeleteLoose:
		return fmt.Sprintf("dell  %s %s %s", side, r.p, strings.Join(r.keys, ","))
	}
	var parts []string
	for _, pc := range r.batch.Preconditions {
		if pc.Absent {
			parts = append(parts, "?!"+pc.Key)
		} else {
			parts = append(parts, "?"+pc.Key)
		}
	}
	for i, w := range r.batch.Writes {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("…+%d", len(r.batch.Writes)-8))
			break
		}
		if w.Delete {
			parts = append(parts, "-"+w.Key)
		} else if strings.HasPrefix(w.Key, relaycore.ReservedPrefix) || w.Key == relaycore.KeyOS || w.Key == relaycore.KeyRS {
			parts = append(parts, "+"+w.Key+"="+clip(w.Value, 60))
		} else {
			parts = append(parts, "+"+w.Key)
		}
	}
	return fmt.Sprintf("apply %s %s %s", side, r.p, strings.Join(parts, " "))
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

type result struct {
	val   []byte
	found bool
	vals  map[string][]byte // opGetMany
	page  relaycore.ScanPage
	err   error
}

type decision struct {
	die bool
	res result
}

type event struct {
	a        *actor
	req      *request
	wakeAt   int64
	done     bool
	panicked any
	stack    []byte
}

type actorState int

const (
	running actorState = iota
	parked
	sleeping
	finished
)

type actorKind int

const (
	kindWriter actorKind = iota
	kindLeaseWriter
	kindAlarm
	kindFire
	kindDeclare
	kindDrain
	kindOperator
)

// actor is one simulated process: a goroutine that runs engine code and
// parks before every store call until the scheduler picks it.
type actor struct {
	sim       *simulation
	id        int
	name      string
	kind      actorKind
	source    relaycore.Partition
	skewMS    int64
	resume    chan decision
	state     actorState
	req       *request
	wakeAt    int64
	resumedAt int64
	dead      bool
	startCall int // store calls made before the actor started

	// writers
	plan     *writerPlan
	inc      int
	call     int              // number of the current Enqueue call
	lease    *relaycore.Lease // lease passed to the current call
	deadline int64            // effective deadline of the current call (0: none)

	// operators: the archive entry being requeued (0: none), so the
	// checker knows whose rows an operator commits.
	requeueID uint64
}

// main is the actor goroutine. Process death is runtime.Goexit from the
// gate, so deferred calls still run; the done event tells the scheduler.
func (a *actor) main() {
	ev := event{a: a, done: true}
	defer func() {
		if p := recover(); p != nil {
			ev.panicked, ev.stack = p, debug.Stack()
		}
		a.sim.evts <- ev
	}()
	a.body()
}

// park parks a with req and returns the scheduler's answer.
func (a *actor) park(req *request) result {
	if a.dead {
		return result{err: errors.New("sim: actor is dead")}
	}
	a.sim.evts <- event{a: a, req: req}
	d := <-a.resume
	if d.die {
		exit()
	}
	return d.res
}

// sleep parks a until sim time at (ms).
func (a *actor) sleep(at int64) {
	if a.dead {
		return
	}
	a.sim.evts <- event{a: a, wakeAt: at}
	if d := <-a.resume; d.die {
		exit()
	}
}

// Now implements relaycore.Clock: sim time plus the actor's skew.
func (a *actor) Now() time.Time { return time.UnixMilli(a.sim.now + a.skewMS) }

// Kick implements relaycore.Kicker: a one-time schedule that may be lost,
// delivered at least once, and collapses duplicates for one (source, due).
func (a *actor) Kick(_ context.Context, source relaycore.Partition, dueMS int64) error {
	s := a.sim
	if a.dead || s.ph != chaos {
		return nil
	}
	k := kick{source, dueMS}
	if s.kickSeen[k] {
		return nil // ConflictException: already armed
	}
	s.kickSeen[k] = true
	if s.rng.IntN(100) < s.sc.kickLossPer100 {
		return errors.New("sim: kick lost")
	}
	i, _ := slices.BinarySearchFunc(s.kicks, k, func(x, y kick) int { return cmp.Compare(x.due, y.due) })
	s.kicks = slices.Insert(s.kicks, i, k)
	return nil
}
