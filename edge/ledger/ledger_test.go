package ledger

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestBackoff(t *testing.T) {
	p := Policy{MaxRetries: 10, Initial: time.Second, Max: 10 * time.Second}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		if got := p.Backoff(i + 1); got != w {
			t.Errorf("Backoff(%d) = %v, want %v", i+1, got, w)
		}
	}
	huge := Policy{MaxRetries: 1, Initial: time.Nanosecond, Max: time.Duration(1<<63 - 1)}
	for _, n := range []int{1, 62, 63, 64, 1000} {
		if got := huge.Backoff(n); got <= 0 || got > huge.Max {
			t.Errorf("Backoff(%d) = %v overflowed", n, got)
		}
	}
	for _, bad := range []Policy{{0, time.Second, time.Second}, {1, 0, time.Second}, {1, 2 * time.Second, time.Second}} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("%+v: Validate = %v", bad, err)
		}
	}
}

// TestRetryBudget walks one pair through a full budget, an operator retry
// and a second budget: Attempts only grows, the waits follow Backoff, and
// the record deadletters exactly at MaxRetries failures per budget.
func TestRetryBudget(t *testing.T) {
	f := newLedger(t, nil)
	l, now := f.l, t0
	must[[]string](t)(l.EnsureScheduled("s", []string{"p"}, now))
	attempts := 0
	for budget := 0; budget < 2; budget++ {
		for i := 1; i <= testPolicy.MaxRetries; i++ {
			r, ok, err := l.TryTransitionInflight("s", "p", now)
			if err != nil || !ok {
				t.Fatalf("budget %d attempt %d: claim %v %v", budget, i, ok, err)
			}
			attempts++
			if r.Attempts != attempts || r.BudgetUsed() != i {
				t.Fatalf("attempts %d used %d, want %d %d", r.Attempts, r.BudgetUsed(), attempts, i)
			}
			r, err = l.TransitionFailed("s", "p", fmt.Errorf("attempt %d", attempts), now, testPolicy)
			if err != nil {
				t.Fatal(err)
			}
			if r.LastError != fmt.Sprintf("attempt %d", attempts) {
				t.Fatalf("LastError = %q", r.LastError)
			}
			if i < testPolicy.MaxRetries {
				if r.State != StateFailed || !r.NextAttemptAfter.Equal(now.Add(testPolicy.Backoff(i))) {
					t.Fatalf("after failure %d: %v next %v", i, r.State, r.NextAttemptAfter)
				}
				// Not due yet: a claim is declined without error.
				if _, ok, err := l.TryTransitionInflight("s", "p", r.NextAttemptAfter.Add(-time.Nanosecond)); ok || err != nil {
					t.Fatalf("early claim: %v %v", ok, err)
				}
				now = r.NextAttemptAfter
			} else if r.State != StateDeadletter {
				t.Fatalf("after %d failures: %v, want deadletter", i, r.State)
			}
		}
		if rs, err := l.RetryDeadletter("s", "p", now); err != nil || len(rs) != 1 {
			t.Fatalf("retry: %v %v", rs, err)
		}
		r := must[Record](t)(l.Get("s", "p"))
		if r.State != StateScheduled || r.Attempts != attempts || r.BudgetBase != attempts || !r.NextAttemptAfter.Equal(now) {
			t.Fatalf("after retry: %+v", r)
		}
	}
}

// TestPendingOrder checks the pending scan against a sort of the same
// records: order (NextAttemptAfter, SegmentID, PeerID), cut at now and
// limit, only Scheduled and Failed.
func TestPendingOrder(t *testing.T) {
	f := newLedger(t, &bolt.Options{NoSync: true})
	l := f.l
	// Times deliberately collide so the id tie-breaks matter; negative
	// offsets check the sign handling of the key encoding.
	for i, seg := range []string{"b", "a", "c", "a2", "0"} {
		must[[]string](t)(l.EnsureScheduled(seg, []string{"z", "y", "x"}, t0.Add(time.Duration(i%2)*time.Second)))
	}
	must[[]string](t)(l.EnsureScheduled("old", []string{"p"}, time.Unix(-5, 0)))
	// Make some records non-pending, some Failed in the future.
	claimOK(t, l, "b", "z", t0)
	claimOK(t, l, "a", "x", t0)
	must[Record](t)(l.TransitionAcked("a", "x", t0))
	claimOK(t, l, "c", "y", t0)
	must[Record](t)(l.TransitionFailed("c", "y", errors.New("e"), t0, testPolicy)) // due t0+1s

	all := allRecords(t, l)
	var model []Record
	for _, r := range all {
		if r.State == StateScheduled || r.State == StateFailed {
			model = append(model, r)
		}
	}
	slices.SortFunc(model, func(a, b Record) int {
		if c := a.NextAttemptAfter.Compare(b.NextAttemptAfter); c != 0 {
			return c
		}
		if c := strings.Compare(a.SegmentID, b.SegmentID); c != 0 {
			return c
		}
		return strings.Compare(a.PeerID, b.PeerID)
	})
	for _, now := range []time.Time{time.Unix(-10, 0), t0, t0.Add(time.Second), t0.Add(time.Hour)} {
		var due []Record
		for _, r := range model {
			if !r.NextAttemptAfter.After(now) {
				due = append(due, r)
			}
		}
		for _, limit := range []int{0, 1, 3, 100} {
			got := must[[]Record](t)(l.Pending(now, limit))
			want := due
			if limit > 0 && len(want) > limit {
				want = want[:limit]
			}
			if keys(got) != keys(want) {
				t.Errorf("Pending(%v, %d):\n got  %s\n want %s", now, limit, keys(got), keys(want))
			}
		}
	}
}

func claimOK(t *testing.T, l *Ledger, seg, peer string, now time.Time) {
	t.Helper()
	if _, ok, err := l.TryTransitionInflight(seg, peer, now); err != nil || !ok {
		t.Fatalf("claim %s/%s: %v %v", seg, peer, ok, err)
	}
}

func keys(rs []Record) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%s/%s ", r.SegmentID, r.PeerID)
	}
	return b.String()
}

func allRecords(t *testing.T, l *Ledger) []Record {
	t.Helper()
	var out []Record
	if err := l.each(func(r Record) error { out = append(out, r); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestClaimIsExclusive: many workers race for the same records; each
// record is claimed exactly once.
func TestClaimIsExclusive(t *testing.T) {
	f := newLedger(t, &bolt.Options{NoSync: true})
	peers := []string{"p1", "p2", "p3", "p4"}
	must[[]string](t)(f.l.EnsureScheduled("s", peers, t0))
	const workers = 8
	var mu sync.Mutex
	wins := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for _, p := range peers {
				_, ok, err := f.l.TryTransitionInflight("s", p, t0)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					wins[p]++
					mu.Unlock()
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	for _, p := range peers {
		if wins[p] != 1 {
			t.Errorf("peer %s claimed %d times, want 1", p, wins[p])
		}
		if r := must[Record](t)(f.l.Get("s", p)); r.Attempts != 1 || r.State != StateInflight {
			t.Errorf("%s: %+v", p, r)
		}
	}
}

func TestEnsureScheduledKeepsExisting(t *testing.T) {
	f := newLedger(t, nil)
	created := must[[]string](t)(f.l.EnsureScheduled("s", []string{"a", "b"}, t0))
	if !slices.Equal(created, []string{"a", "b"}) {
		t.Fatalf("created %v", created)
	}
	claimOK(t, f.l, "s", "a", t0)
	created = must[[]string](t)(f.l.EnsureScheduled("s", []string{"a", "b", "c"}, t0.Add(time.Hour)))
	if !slices.Equal(created, []string{"c"}) {
		t.Fatalf("second call created %v, want [c]", created)
	}
	if r := must[Record](t)(f.l.Get("s", "a")); r.State != StateInflight {
		t.Fatalf("existing record overwritten: %+v", r)
	}
	if r := must[Record](t)(f.l.Get("s", "b")); !r.NextAttemptAfter.Equal(t0) {
		t.Fatalf("existing schedule time changed: %+v", r)
	}
}

func TestWildcardRetryAndPurge(t *testing.T) {
	f := newLedger(t, nil)
	l := f.l
	deadP := Policy{MaxRetries: 1, Initial: time.Second, Max: time.Second}
	// s1/pa s1/pb s2/pa deadletter; s2/pb acked; s3/pa scheduled.
	for _, k := range [][2]string{{"s1", "pa"}, {"s1", "pb"}, {"s2", "pa"}, {"s2", "pb"}} {
		must[[]string](t)(l.EnsureScheduled(k[0], []string{k[1]}, t0))
		claimOK(t, l, k[0], k[1], t0)
		if k == [2]string{"s2", "pb"} {
			must[Record](t)(l.TransitionAcked(k[0], k[1], t0))
		} else {
			must[Record](t)(l.TransitionFailed(k[0], k[1], errors.New("down"), t0, deadP))
		}
	}
	must[[]string](t)(l.EnsureScheduled("s3", []string{"pa"}, t0))

	if rs := must[[]Record](t)(l.RetryDeadletter("", "pa", t0)); keys(rs) != "s1/pa s2/pa " || rs[0].State != StateDeadletter || rs[0].LastError != "down" {
		t.Fatalf("retry peer pa returned %+v, want s1/pa and s2/pa as they were (deadletter, down)", rs)
	}
	dl := must[[]Record](t)(l.ListByState(StateDeadletter))
	if keys(dl) != "s1/pb " {
		t.Fatalf("deadletter after retry: %s", keys(dl))
	}
	if rs := must[[]Record](t)(l.Purge("s1", "")); keys(rs) != "s1/pb " {
		t.Fatalf("purge s1 removed %s", keys(rs))
	}
	if _, err := l.Get("s1", "pb"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("purged record still there: %v", err)
	}
	if rs := must[[]Record](t)(l.Purge("", "")); len(rs) != 0 {
		t.Fatalf("purge all removed %s, want none (none deadlettered)", keys(rs))
	}
	for peer, want := range map[string]bool{"pa": true, "pb": true, "pz": false} {
		if got := must[bool](t)(l.HasPeer(peer)); got != want {
			t.Errorf("HasPeer(%s) = %v, want %v", peer, got, want)
		}
	}
	counts := must[map[State]int](t)(l.Counts())
	if counts[StateScheduled] != 3 || counts[StateAcked] != 1 || len(counts) != 2 {
		t.Fatalf("counts %v", counts)
	}
	if got := keys(must[[]Record](t)(l.ListBySegment("s2"))); got != "s2/pa s2/pb " {
		t.Fatalf("ListBySegment(s2) = %s", got)
	}
	// A segment id that is a prefix of another must not leak into its list.
	must[[]string](t)(l.EnsureScheduled("s", []string{"q"}, t0))
	if got := keys(must[[]Record](t)(l.ListBySegment("s"))); got != "s/q " {
		t.Fatalf("ListBySegment(s) = %s", got)
	}
}

func TestInvalidIDs(t *testing.T) {
	f := newLedger(t, nil)
	for _, ids := range [][2]string{{"", "p"}, {"s", ""}, {"s\x00x", "p"}, {strings.Repeat("s", MaxIDLen+1), "p"}} {
		if _, err := f.l.EnsureScheduled(ids[0], []string{ids[1]}, t0); !errors.Is(err, ErrInvalidID) {
			t.Errorf("EnsureScheduled(%q, %q) = %v", ids[0], ids[1], err)
		}
		if _, _, err := f.l.TryTransitionInflight(ids[0], ids[1], t0); !errors.Is(err, ErrInvalidID) {
			t.Errorf("TryTransitionInflight(%q, %q) = %v", ids[0], ids[1], err)
		}
	}
	if _, err := f.l.TransitionFailed("s", "p", nil, t0, Policy{}); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("zero policy accepted: %v", err)
	}
}

// TestRecoverAfterReopen simulates a crash: records left Inflight, a
// segment gone, and the database reopened from its file.
func TestRecoverAfterReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edged.db")
	db := must[*bolt.DB](t)(bolt.Open(path, 0o600, nil))
	l := must[*Ledger](t)(Open(db))
	must[[]string](t)(l.EnsureScheduled("kept", []string{"a", "b", "c"}, t0))
	must[[]string](t)(l.EnsureScheduled("gone", []string{"a", "b"}, t0))
	claimOK(t, l, "kept", "a", t0) // abandoned in flight
	claimOK(t, l, "kept", "b", t0)
	must[Record](t)(l.TransitionAcked("kept", "b", t0))
	claimOK(t, l, "kept", "c", t0)
	must[Record](t)(l.TransitionFailed("kept", "c", errors.New("e"), t0, testPolicy)) // due t0+1s
	claimOK(t, l, "gone", "a", t0)                                                    // in flight, segment gone
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = must[*bolt.DB](t)(bolt.Open(path, 0o600, nil))
	t.Cleanup(func() { checkInvariants(t, db); db.Close() })
	l = must[*Ledger](t)(Open(db))
	var asked []string
	exists := func(seg string) bool { asked = append(asked, seg); return seg != "gone" }
	now := t0.Add(time.Minute)
	rep, err := l.Recover(now, testPolicy, heldBy(exists))
	if err != nil {
		t.Fatal(err)
	}
	// kept/a: Inflight → Failed(due now+1s); gone/a: Inflight → Failed, then
	// both gone records → Deadletter; kept/c due → Scheduled.
	if rep != (RecoveryReport{AbandonedInflight: 2, PrunedMissing: 2, Rescheduled: 1}) {
		t.Fatalf("report %+v", rep)
	}
	if !slices.Equal(asked, []string{"gone", "kept"}) {
		t.Fatalf("exists called for %v, want each live segment once in order", asked)
	}
	want := map[string]State{"kept/a": StateFailed, "kept/b": StateAcked, "kept/c": StateScheduled, "gone/a": StateDeadletter, "gone/b": StateDeadletter}
	for _, r := range allRecords(t, l) {
		if w := want[r.SegmentID+"/"+r.PeerID]; r.State != w {
			t.Errorf("%s/%s = %v, want %v", r.SegmentID, r.PeerID, r.State, w)
		}
	}
	ka := must[Record](t)(l.Get("kept", "a"))
	if ka.Attempts != 1 || !ka.NextAttemptAfter.Equal(now.Add(time.Second)) || !strings.Contains(ka.LastError, "abandoned") {
		t.Fatalf("kept/a %+v", ka)
	}
	// Idempotent: a second run changes nothing.
	if rep, err := l.Recover(now, testPolicy, heldBy(exists)); err != nil || rep != (RecoveryReport{}) {
		t.Fatalf("second recover: %+v %v", rep, err)
	}
}

func TestInflightToFailedSpendsBudget(t *testing.T) {
	f := newLedger(t, nil)
	p := Policy{MaxRetries: 1, Initial: time.Second, Max: time.Second}
	must[[]string](t)(f.l.EnsureScheduled("s", []string{"p"}, t0))
	claimOK(t, f.l, "s", "p", t0)
	if n := must[int](t)(f.l.InflightToFailed(t0, p)); n != 1 {
		t.Fatal(n)
	}
	if r := must[Record](t)(f.l.Get("s", "p")); r.State != StateDeadletter {
		t.Fatalf("abandoned attempt with spent budget: %v, want deadletter", r.State)
	}
}

func TestParseState(t *testing.T) {
	for _, s := range States() {
		got, err := ParseState(strings.ToUpper(s.String()))
		if err != nil || got != s {
			t.Errorf("ParseState(%s) = %v %v", s, got, err)
		}
	}
	if _, err := ParseState("done"); err == nil {
		t.Error("ParseState(done) accepted")
	}
}

// TestAckClearsLastError: an attempt that fails and a retry that is acked
// leave an Acked record without the earlier error (it read as failed), and
// with both attempts counted.
func TestAckClearsLastError(t *testing.T) {
	f := newLedger(t, nil)
	l, now := f.l, t0
	must[[]string](t)(l.EnsureScheduled("s", []string{"p"}, now))
	if _, ok, err := l.TryTransitionInflight("s", "p", now); !ok || err != nil {
		t.Fatalf("claim: %v %v", ok, err)
	}
	r := must[Record](t)(l.TransitionFailed("s", "p", errors.New("connection refused"), now, testPolicy))
	now = r.NextAttemptAfter
	if _, ok, err := l.TryTransitionInflight("s", "p", now); !ok || err != nil {
		t.Fatalf("second claim: %v %v", ok, err)
	}
	must[Record](t)(l.TransitionAcked("s", "p", now))
	r = must[Record](t)(l.Get("s", "p"))
	if r.State != StateAcked || r.LastError != "" || r.Attempts != 2 {
		t.Fatalf("acked record %+v: want no last error and 2 attempts", r)
	}
}

// TestOldAckedRecordHidesLastError: a record acked by a version that kept
// the earlier attempt's error on disk does not show it either.
func TestOldAckedRecordHidesLastError(t *testing.T) {
	f := newLedger(t, nil)
	err := f.db.Update(func(tx *bolt.Tx) error {
		v := []byte(`{"state":3,"attempts":2,"budget_base":0,"last_error":"connection refused","updated_ns":1}`)
		return tx.Bucket(rootBucket).Bucket(recordsBucket).Put(recKey("s", "p"), v)
	})
	if err != nil {
		t.Fatal(err)
	}
	r := must[Record](t)(f.l.Get("s", "p"))
	if r.State != StateAcked || r.LastError != "" || r.Attempts != 2 {
		t.Fatalf("old acked record %+v: want no last error", r)
	}
}

// EnsureScheduled on records that all exist (every start's reconciliation
// of every stored segment) commits no write transaction: each would cost
// an fsync, and start-up time grew with them.
func TestEnsureScheduledExistingWritesNothing(t *testing.T) {
	f := newLedger(t, nil)
	must[[]string](t)(f.l.EnsureScheduled("s", []string{"p", "q"}, t0))
	txid := func() int {
		var id int
		if err := f.db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
			t.Fatal(err)
		}
		return id
	}
	before := txid()
	for _, peers := range [][]string{{"p", "q"}, {"q"}, nil} {
		if created := must[[]string](t)(f.l.EnsureScheduled("s", peers, t0)); len(created) != 0 {
			t.Fatalf("created %v again", created)
		}
	}
	if after := txid(); after != before {
		t.Fatalf("%d write transactions committed for records that exist", after-before)
	}
	// A missing record is still created.
	if created := must[[]string](t)(f.l.EnsureScheduled("s", []string{"p", "r"}, t0)); len(created) != 1 || created[0] != "r" {
		t.Fatalf("created %v, want [r]", created)
	}
}

// TestResend: a record the peer acknowledged comes due again with a fresh
// budget and its attempt count kept (a peer that lost its copy asks for
// it); a record being sent is left alone; a pair without a record gets
// one, due at once.
func TestResend(t *testing.T) {
	l := newLedger(t, nil).l
	must[[]string](t)(l.EnsureScheduled("s", []string{"p", "q"}, t0))
	p := Policy{MaxRetries: 5, Initial: time.Nanosecond, Max: time.Nanosecond}
	at := t0
	for range 2 {
		at = at.Add(time.Second)
		if _, ok, err := l.TryTransitionInflight("s", "p", at); err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
		must[Record](t)(l.TransitionFailed("s", "p", errors.New("boom"), at, p))
	}
	at = at.Add(time.Second)
	if _, ok, err := l.TryTransitionInflight("s", "p", at); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	must[Record](t)(l.TransitionAcked("s", "p", at))
	if _, ok, err := l.TryTransitionInflight("s", "q", at); err != nil || !ok {
		t.Fatalf("claim q: %v %v", ok, err)
	}

	now := at.Add(time.Minute)
	r, resent, err := l.Resend("s", "p", now)
	if err != nil || !resent || r.State != StateScheduled || r.Attempts != 3 || r.BudgetUsed() != 0 || !r.NextAttemptAfter.Equal(now) {
		t.Fatalf("Resend of an acked record = %+v, %v, %v", r, resent, err)
	}
	if got, _ := l.Pending(now, 10); len(got) != 1 || got[0].PeerID != "p" {
		t.Fatalf("pending after Resend: %+v", got)
	}
	if r, resent, err := l.Resend("s", "q", now); err != nil || resent || r.State != StateInflight {
		t.Fatalf("Resend of an inflight record = %+v, %v, %v; want it untouched", r, resent, err)
	}
	if r, resent, err := l.Resend("s", "new-peer", now); err != nil || !resent || r.State != StateScheduled || r.Attempts != 0 {
		t.Fatalf("Resend without a record = %+v, %v, %v", r, resent, err)
	}
	if _, _, err := l.Resend("", "p", now); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("Resend with an empty id: %v", err)
	}
}

// TestResendAll: several pairs at once, as Resend each: an acked one and
// an absent one come due, an inflight one is left alone, in the order
// given.
func TestResendAll(t *testing.T) {
	l := newLedger(t, nil).l
	must[[]string](t)(l.EnsureScheduled("s", []string{"acked", "busy"}, t0))
	for _, p := range []string{"acked", "busy"} {
		if _, ok, err := l.TryTransitionInflight("s", p, t0); err != nil || !ok {
			t.Fatalf("claim %s: %v %v", p, ok, err)
		}
	}
	must[Record](t)(l.TransitionAcked("s", "acked", t0))
	now := t0.Add(time.Minute)
	rs, resent, err := l.ResendAll([]Pair{{"s", "acked"}, {"s", "busy"}, {"s", "new"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	want := []State{StateScheduled, StateInflight, StateScheduled}
	for i, r := range rs {
		if r.State != want[i] || resent[i] != (want[i] == StateScheduled) {
			t.Errorf("pair %d: %+v resent %v", i, r, resent[i])
		}
		if got, err := l.Get(r.SegmentID, r.PeerID); err != nil || got.State != want[i] {
			t.Errorf("stored %s: %+v, %v", r.PeerID, got, err)
		}
	}
}
