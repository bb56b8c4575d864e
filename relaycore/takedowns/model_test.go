package takedowns_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// faulty injects crashes around a real store: an Apply that fails before it
// is applied, or after (the caller is told it may have been applied), and
// reads that fail. Off once the model quiesces.
type faulty struct {
	relaycore.Store
	mu   sync.Mutex
	rng  *rand.Rand
	on   bool
	hits int
}

var errInjected = errors.New("injected fault")

func (f *faulty) roll(p float64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.on && f.rng.Float64() < p {
		f.hits++
		return true
	}
	return false
}

func (f *faulty) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if f.roll(0.08) {
		return errInjected // surely not applied
	}
	err := f.Store.Apply(ctx, p, b)
	if err == nil && f.roll(0.08) {
		return fmt.Errorf("%w: %v after the apply", relaycore.ErrMaybeApplied, errInjected)
	}
	return err
}

func (f *faulty) Get(ctx context.Context, p relaycore.Partition, key string) ([]byte, bool, error) {
	if f.roll(0.03) {
		return nil, false, errInjected
	}
	return f.Store.Get(ctx, p, key)
}

func (f *faulty) Scan(ctx context.Context, p relaycore.Partition, req relaycore.ScanRequest) (relaycore.ScanPage, error) {
	if f.roll(0.03) {
		return relaycore.ScanPage{}, errInjected
	}
	return f.Store.Scan(ctx, p, req)
}

// mnode is one edge node as the model runs it: what it holds, its reports
// still to send (each under its idempotency key, resent as is until
// committed), its order cursor and the receipts it has still to post.
type mnode struct {
	name      string
	holds     bool
	everHeld  bool
	evictedAt time.Time
	reports   []mreport
	keys      int
	cursor    string
	outbox    [][]byte
	// signed: edged keeps each request's receipt and answers it again,
	// byte for byte, when the order comes again.
	signed map[string][]byte
}

type mreport struct {
	key string
	r   takedowns.Report
}

const content = "seg-9f2c"

// TestModel runs the owner with nodes' reports racing takedown requests,
// owner passes, operators' waivers, fires and receipts, in a seeded order,
// with crashes injected into every store call (before and after applies,
// and reads). The invariants, each checked from the raw partitions and not
// through Status's own reasoning:
//   - Safety, after every step: no takedown is reported complete while a
//     node the holder index says holds the content has neither a receipt
//     proving an eviction after that report nor a waiver that saw that
//     report (a waiver releases the copy the operator knew of: a held
//     report committed after it makes the node a late holder again, as
//     issue 23 says of any node that reports the content after a request).
//   - Audit: every stored waiver is one an operator's call made, with its
//     caller (who), its reason (why) and a time within the call (when);
//     every waiver the owner answered for is stored, and none replaces
//     another (a renewal is a waiver of its own).
//   - Receipts: no honest receipt is refused, a waived holder's included,
//     and every accepted one is stored in a takedown.
//   - Liveness, once the faults stop: every takedown completes; every node
//     has evicted unless each takedown holds a waiver that saw its last
//     report; no node was requested again before it proved the eviction
//     its latest request asked for; no request was ordered twice.
//
// Six seeds in make test; RELAY_TAKEDOWN_MODEL_SEEDS=N runs N.
func TestModel(t *testing.T) {
	seeds := 6
	if v := os.Getenv("RELAY_TAKEDOWN_MODEL_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("RELAY_TAKEDOWN_MODEL_SEEDS=%q", v)
		}
		seeds = n
	}
	if v := os.Getenv("RELAY_TAKEDOWN_MODEL_OWNERS"); v != "" {
		nOwners, _ = strconv.Atoi(v)
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("seed %d", seed)
				}
			}()
			runModel(t, seed)
		})
	}
}

var nOwners = 3

func runModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x7a4e))
	s := &sched{rng: rand.New(rand.NewPCG(seed, 3)), parked: make(chan *actor)}
	src := &faulty{Store: &gated{Store: mem.New(relaycore.Capabilities{}), s: s}, rng: rand.New(rand.NewPCG(seed, 1)), on: true}
	dst := &faulty{Store: &gated{Store: mem.New(relaycore.Capabilities{}), s: s}, rng: rand.New(rand.NewPCG(seed, 2)), on: true}
	e := newEnv(t, src, dst)
	e.relay.QuarantineAfter = -1
	// Three owners on the same stores, each with a relay handler of its
	// own (relay serve replicas; fire and sweep invocations at once): their
	// passes run as actors, interleaved store call by store call.
	var owners []*takedowns.Owner
	for range nOwners {
		r := *e.relay
		owners = append(owners, &takedowns.Owner{Relay: &r, Roots: e.o.Roots})
	}
	ended := func(a *actor) {
		if a != nil && a.done && a.err != nil && !transient(a.err) {
			t.Fatalf("owner: %v", a.err)
		}
	}
	// accepted: every receipt the relay accepted, by request: none may be
	// lost, whatever the owners did meanwhile.
	accepted := map[string][]byte{}
	passes, overlapped := 0, 0
	nodes := []*mnode{{name: "edge-a"}, {name: "edge-b"}, {name: "edge-c"}}
	for _, n := range nodes {
		e.nodes[n.name] = true
		n.signed = map[string][]byte{}
	}
	keys := map[string]bool{}
	ctx := e.ctx
	requests := 0

	acquire := func(n *mnode) {
		n.holds, n.everHeld = true, true
		n.keys++
		n.reports = append(n.reports, mreport{fmt.Sprintf("%s/%d", n.name, n.keys), takedowns.Report{ContentID: content,
			SHA256: digestOf(content), Size: 1, State: "held", ObservedMS: e.clock.Now().UnixMilli()}})
	}
	sendReport := func(n *mnode) {
		if len(n.reports) == 0 {
			return
		}
		r := n.reports[0]
		_, err := e.o.Report(ctx, n.name, r.key, []takedowns.Report{r.r})
		if err == nil {
			n.reports = n.reports[1:]
		} else if !transient(err) {
			t.Fatalf("report %s: %v", r.key, err)
		}
	}
	pull := func(n *mnode) {
		os, _, err := e.o.Orders(ctx, n.name, n.cursor, 10)
		if err != nil {
			if !transient(err) {
				t.Fatalf("orders of %s: %v", n.name, err)
			}
			return
		}
		for _, o := range os {
			if n.holds {
				// Daemon.Takedown: evict, report the eviction, sign.
				n.holds, n.evictedAt = false, e.clock.Now().UTC()
				n.keys++
				n.reports = append(n.reports, mreport{fmt.Sprintf("%s/%d", n.name, n.keys), takedowns.Report{ContentID: content,
					SHA256: digestOf(content), Size: 1, State: "evicted", ObservedMS: e.clock.Now().UnixMilli()}})
			}
			// Evicted before: a receipt of its own for that same eviction.
			if n.signed[o.Request] == nil {
				n.signed[o.Request] = e.evict(e.pki, n.name, o, n.evictedAt)
			}
			n.outbox = append(n.outbox, n.signed[o.Request])
			n.cursor = o.Cursor
		}
	}
	post := func(n *mnode) {
		if len(n.outbox) == 0 {
			return
		}
		res, err := e.o.Receipt(ctx, n.name, n.outbox[0])
		switch {
		case err == nil:
			accepted[res.Request] = n.outbox[0]
			n.outbox = n.outbox[1:]
		case errors.Is(err, takedowns.ErrRefused):
			t.Fatalf("%s's honest receipt refused: %v", n.name, err)
		case !transient(err):
			t.Fatalf("receipt of %s: %v", n.name, err)
		}
	}
	// waives: every waiver call an operator made, and what it answered.
	var waives []*mwaive
	waive := func(n *mnode) {
		open := rawItems(t, e, takedowns.OpenTarget, "")
		if len(open) == 0 {
			return
		}
		c := &mwaive{id: open[rng.IntN(len(open))].Key, node: n.name, by: fmt.Sprintf("op-%d", len(waives)),
			reason: fmt.Sprintf("device gone, ticket %d", len(waives)), startMS: e.clock.Now().UnixMilli()}
		waives = append(waives, c)
		o := owners[rng.IntN(len(owners))]
		s.start(ctx, func(ctx context.Context) error {
			w, err := o.Waive(ctx, c.id, c.node, c.reason, c.by)
			c.endMS = e.clock.Now().UnixMilli()
			switch {
			case err == nil:
				c.w, c.ok = w, true
			case errors.Is(err, takedowns.ErrWaived), errors.Is(err, takedowns.ErrNotHolder), errors.Is(err, takedowns.ErrNotFound), transient(err):
			default:
				return err
			}
			return nil
		})
	}
	fire := func(s relaycore.Partition) {
		if _, err := e.relay.Fire(ctx, s); err != nil && !transient(err) {
			t.Fatalf("fire %s: %v", s, err)
		}
	}
	sources := []relaycore.Partition{takedowns.ControlSource}
	for _, n := range nodes {
		sources = append(sources, takedowns.HoldingsSource(n.name))
	}

	for step := range 260 {
		n := nodes[rng.IntN(len(nodes))]
		switch k := rng.IntN(100); {
		case k < 8:
			// Acquire it (from a peer), or again after a rebuilt edged.db.
			if !n.holds && (!n.everHeld || rng.IntN(4) == 0) {
				acquire(n)
			}
		case k < 25:
			sendReport(n)
		case k < 30:
			if requests < 2 {
				if _, err := e.o.Request(ctx, content, "dmca 2026-118", "operator", takedowns.RequestOptions{}); err == nil {
					requests++
				} else if !transient(err) {
					t.Fatalf("request: %v", err)
				}
			}
		case k < 55:
			fire(sources[rng.IntN(len(sources))])
		case k < 68:
			if len(s.actors) < len(owners) {
				o := owners[rng.IntN(len(owners))]
				if len(s.actors) > 0 {
					overlapped++
				}
				passes++
				s.start(ctx, func(ctx context.Context) error { _, err := o.Run(ctx); return err })
			} else {
				ended(s.step())
			}
		case k < 82:
			pull(n)
		case k < 85:
			if len(s.actors) < len(owners) {
				waive(n)
			}
		default:
			post(n)
		}
		// The passes under way move on by a few store calls.
		for range rng.IntN(4) {
			ended(s.step())
		}
		// At least a millisecond a step: a node's reports and evictions
		// are ordered by its clock, as edged's are.
		e.clock.add(time.Duration(1+rng.IntN(800)) * time.Millisecond)
		checkSafety(t, e, step)
	}
	if requests == 0 {
		if _, err := e.o.Request(ctx, content, "dmca 2026-118", "operator", takedowns.RequestOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Quiesce: the passes under way end (faults still on), then no more
	// faults, no more acquisitions; the system settles.
	for len(s.actors) > 0 {
		ended(s.step())
		checkSafety(t, e, -1)
	}
	src.mu.Lock()
	src.on = false
	src.mu.Unlock()
	dst.mu.Lock()
	dst.on = false
	dst.mu.Unlock()
	// Targets that failed hold their rows for a retry at a later time,
	// and no target is quarantined for good (QuarantineAfter < 0): the
	// model moves the clock on so that every retry comes due.
	for range 12 {
		e.clock.add(10 * time.Minute)
		for _, n := range nodes {
			for len(n.reports) > 0 {
				sendReport(n)
			}
		}
		e.deliver()
		e.run()
		e.deliver()
		for _, n := range nodes {
			pull(n)
			for len(n.outbox) > 0 {
				post(n)
			}
		}
		e.deliver()
		checkSafety(t, e, -1)
	}
	open, err := relaycore.ReadTarget(ctx, dst, takedowns.OpenTarget, relaycore.TargetReadRequest{Limit: 100})
	if err != nil || len(open.Items) == 0 {
		t.Fatalf("open takedowns: %v %v", open.Items, err)
	}
	stored := map[string]bool{}
	for _, it := range open.Items {
		st := e.status(it.Key)
		if !st.Complete {
			t.Errorf("takedown %s not complete after quiescing: %+v", it.Key, st)
		}
		// A node is requested again in a takedown only once it proved the
		// eviction its latest request asked for: two owners deriving one
		// late holder's request from different views of the index must not
		// make it two requests.
		td := takedowns.TakedownTarget(it.Key)
		items, err := relaycore.ReadTarget(ctx, dst, td, relaycore.TargetReadRequest{Limit: 1000})
		if err != nil || items.Next != "" {
			t.Fatalf("read %s: %v", td, err)
		}
		byNode := map[string][]relaycore.ContentTakedownV1{}
		receipts := map[string]bool{}
		for _, kv := range items.Items {
			switch {
			case strings.HasPrefix(kv.Key, relaycore.TakedownHandoffPrefix):
			case strings.HasPrefix(kv.Key, relaycore.TakedownPrefix):
				r, err := relaycore.DecodeTakedown(kv.Value)
				if err != nil {
					t.Fatal(err)
				}
				byNode[r.LateHolder] = append(byNode[r.LateHolder], r)
			case strings.HasPrefix(kv.Key, "receipt/"):
				receipts[strings.TrimPrefix(kv.Key, "receipt/")] = true
				stored[strings.TrimPrefix(kv.Key, "receipt/")] = true
			}
		}
		for node, rs := range byNode {
			slices.SortFunc(rs, func(a, b relaycore.ContentTakedownV1) int { return cmp.Compare(a.RequestedMS, b.RequestedMS) })
			for _, r := range rs[:len(rs)-1] {
				if req := fmt.Sprintf("%s/%s/%019d", r.ContentID, r.LateHolder, r.RequestedMS); !receipts[req] {
					t.Errorf("takedown %s: %s requested again (%d requests) before it proved the eviction %s asked for", it.Key, node, len(rs), req)
				}
			}
		}
	}
	for req := range accepted {
		if !stored[req] {
			t.Errorf("receipt for %s accepted and stored in no takedown", req)
		}
	}
	checkWaivers(t, e, waives)
	for _, n := range nodes {
		released := true
		for _, it := range open.Items {
			released = released && waiverSaw(t, e, it.Key, n.name)
		}
		if n.holds && !released {
			hs, _ := e.o.Holders(ctx, content)
			var sts []takedowns.Status
			for _, it := range open.Items {
				sts = append(sts, e.status(it.Key))
			}
			t.Errorf("%s still holds the content: node %+v, index %+v, takedowns %+v", n.name, *n, hs, sts)
		}
		pg, err := relaycore.ReadTarget(ctx, dst, takedowns.OrdersTarget(n.name), relaycore.TargetReadRequest{Prefix: "o/", Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range pg.Items {
			var o takedowns.Order
			json.Unmarshal(it.Value, &o)
			// One order per request and takedown (two takedowns of one
			// content may share a late holder's request).
			if k := o.Request + " for " + o.Takedown; keys[k] {
				t.Errorf("request %s ordered twice", k)
			} else {
				keys[k] = true
			}
		}
	}
	nw := 0
	for _, c := range waives {
		if c.ok {
			nw++
		}
	}
	t.Logf("seed %d: %d requests, owner passes %d (%d begun during another), waivers %d of %d asked, faults injected %d+%d, orders %d",
		seed, requests, passes, overlapped, nw, len(waives), src.hits, dst.hits, len(keys))
}

// transient reports whether err is an injected fault's consequence (the
// caller retries later), not a refusal or a bug.
func transient(err error) bool {
	return errors.Is(err, errInjected) || errors.Is(err, relaycore.ErrMaybeApplied) || errors.Is(err, relaycore.ErrCommitUnknown) ||
		errors.Is(err, relaycore.ErrContention) || errors.Is(err, takedowns.ErrNotYet) || errors.Is(err, relaycore.ErrSourceBusy) ||
		strings.Contains(err.Error(), errInjected.Error())
}

// checkSafety: a takedown reported complete has, for every node the holder
// index says holds the content, a stored receipt of that node dated after
// the report's observation (its own clock on both), or a waiver that saw
// that report (its report_seq is at least the report's seq). Computed from
// the raw partitions, not from Status's own reasoning.
func checkSafety(t *testing.T, e *env, step int) {
	t.Helper()
	ctx := context.Background()
	for _, it := range rawItems(t, e, takedowns.OpenTarget, "") {
		st, err := e.o.Status(ctx, it.Key)
		if err != nil || !st.Complete {
			continue
		}
		evicted := map[string]time.Time{}
		for _, kv := range rawItems(t, e, takedowns.TakedownTarget(it.Key), "receipt/") {
			s, err := takedown.ParseLine(kv.Value)
			if err != nil {
				t.Fatalf("stored receipt: %v", err)
			}
			if s.Receipt.EvictedAt.After(evicted[s.Receipt.Node]) {
				evicted[s.Receipt.Node] = s.Receipt.EvictedAt
			}
		}
		for node, h := range rawIndex(t, e) {
			if h.State == "held" && !waiverSaw(t, e, it.Key, node) && evicted[node].UnixMilli() < h.ObservedMS {
				t.Fatalf("step %d: takedown %s reported complete while %s holds the content (reported at %d, seq %d, last eviction proved %v): %+v",
					step, it.Key, node, h.ObservedMS, h.Seq, evicted[node], st)
			}
		}
	}
}

// rawItems reads a target partition past the faults and the scheduler.
func rawItems(t *testing.T, e *env, p relaycore.Partition, prefix string) []relaycore.KV {
	t.Helper()
	pg, err := relaycore.ReadTarget(context.Background(), unwrap(e.dst), p, relaycore.TargetReadRequest{Prefix: prefix, Limit: 1000})
	if err != nil || pg.Next != "" {
		t.Fatalf("read %s: %v", p, err)
	}
	return pg.Items
}

// rawHolder is a node's record in the holder index as stored: its last
// report and the seq of the row that carried it (the hook's "/at").
type rawHolder struct {
	State      string `json:"state"`
	ObservedMS int64  `json:"observed_ms"`
	Seq        uint64
}

func rawIndex(t *testing.T, e *env) map[string]rawHolder {
	t.Helper()
	out := map[string]rawHolder{}
	for _, kv := range rawItems(t, e, takedowns.HoldersTarget(content), content+"/") {
		rest := strings.TrimPrefix(kv.Key, content+"/")
		if node, ok := strings.CutSuffix(rest, "/at"); ok {
			var at struct {
				Seq uint64 `json:"seq"`
			}
			json.Unmarshal(kv.Value, &at)
			h := out[node]
			h.Seq = at.Seq
			out[node] = h
			continue
		}
		h := out[rest]
		json.Unmarshal(kv.Value, &h)
		out[rest] = h
	}
	return out
}

// rawWaiver is a stored waiver: who, why, when and the report of the node
// it saw.
type rawWaiver struct {
	By        string `json:"by"`
	Reason    string `json:"reason"`
	AtMS      int64  `json:"at_ms"`
	ReportSeq uint64 `json:"report_seq"`
}

// rawWaivers are node's waivers in takedown id, each a key of its own.
func rawWaivers(t *testing.T, e *env, id, node string) []rawWaiver {
	t.Helper()
	var out []rawWaiver
	for _, kv := range rawItems(t, e, takedowns.TakedownTarget(id), "waive/"+node+"/") {
		var w rawWaiver
		if err := json.Unmarshal(kv.Value, &w); err != nil {
			t.Fatalf("waiver %s of %s: %v", kv.Key, id, err)
		}
		out = append(out, w)
	}
	return out
}

// waiverSaw reports whether takedown id holds a waiver of node that saw
// the node's current record in the holder index (or there is none).
func waiverSaw(t *testing.T, e *env, id, node string) bool {
	t.Helper()
	seq := rawIndex(t, e)[node].Seq
	for _, w := range rawWaivers(t, e, id, node) {
		if seq <= w.ReportSeq {
			return true
		}
	}
	return false
}

// mwaive is one operator's waiver call in the model and its answer.
type mwaive struct {
	id, node, by, reason string
	startMS, endMS       int64
	w                    takedowns.Waiver
	ok                   bool
}

// checkWaivers: the audit. Every stored waiver is one a call made: its
// caller, its reason, a time within the call; every waiver a call was
// answered is stored, once.
func checkWaivers(t *testing.T, e *env, calls []*mwaive) {
	t.Helper()
	byName := map[string]*mwaive{}
	for _, c := range calls {
		byName[c.by] = c
	}
	stored := map[string]bool{}
	for _, it := range rawItems(t, e, takedowns.OpenTarget, "") {
		for _, kv := range rawItems(t, e, takedowns.TakedownTarget(it.Key), "waive/") {
			node, _, _ := strings.Cut(strings.TrimPrefix(kv.Key, "waive/"), "/")
			var x rawWaiver
			if err := json.Unmarshal(kv.Value, &x); err != nil {
				t.Fatalf("waiver %s: %v", kv.Key, err)
			}
			switch c := byName[x.By]; {
			case c == nil || c.id != it.Key || c.node != node || c.reason != x.Reason:
				t.Errorf("takedown %s: waiver of %s %+v made by no operator's call (who, why): %+v", it.Key, node, x, c)
			case x.AtMS < c.startMS || x.AtMS > c.endMS:
				t.Errorf("takedown %s: waiver of %s at %d, outside its call [%d, %d]", it.Key, node, x.AtMS, c.startMS, c.endMS)
			case stored[x.By]:
				t.Errorf("takedown %s: waiver %+v stored twice", it.Key, x)
			}
			stored[x.By] = true
		}
	}
	for _, c := range calls {
		if c.ok && (!stored[c.by] || c.w.By != c.by || c.w.Reason != c.reason) {
			t.Errorf("waiver %+v answered and not stored as answered", *c)
		}
	}
}

func unwrap(c *counting) relaycore.Store {
	if f, ok := c.Store.(*faulty); ok {
		if g, ok := f.Store.(*gated); ok {
			return g.Store
		}
		return f.Store
	}
	return c.Store
}
