package ledger

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestAssuranceAndCanEvict: per-peer states of segment "s" against both
// conditions. Required peers are a, b unless stated.
func TestAssuranceAndCanEvict(t *testing.T) {
	type peerState map[string]State
	cases := []struct {
		name     string
		states   peerState
		required []string
		cond     Condition
		acked    []string
		met      bool
		evict    bool
	}{
		{"all: both acked", peerState{"a": StateAcked, "b": StateAcked}, nil, AllPeers, []string{"a", "b"}, true, true},
		{"all: one acked one failed", peerState{"a": StateAcked, "b": StateFailed}, nil, AllPeers, []string{"a"}, false, false},
		{"all: one acked one deadletter", peerState{"a": StateAcked, "b": StateDeadletter}, nil, AllPeers, []string{"a"}, false, false},
		{"all: one acked one missing", peerState{"a": StateAcked}, nil, AllPeers, []string{"a"}, false, false},
		{"all: non-required ack does not count", peerState{"a": StateAcked, "x": StateAcked}, []string{"a", "b"}, AllPeers, []string{"a"}, false, false},
		{"all: no required peers", peerState{"a": StateAcked}, []string{}, AllPeers, nil, false, false},
		{"one: one acked, other deadletter", peerState{"a": StateAcked, "b": StateDeadletter}, nil, OnePeer, []string{"a"}, true, true},
		{"one: one acked, other scheduled", peerState{"a": StateAcked, "b": StateScheduled}, nil, OnePeer, []string{"a"}, true, false},
		{"one: one acked, other inflight", peerState{"a": StateAcked, "b": StateInflight}, nil, OnePeer, []string{"a"}, true, false},
		{"one: one acked, other failed", peerState{"a": StateAcked, "b": StateFailed}, nil, OnePeer, []string{"a"}, true, false},
		{"one: one acked, other missing", peerState{"a": StateAcked}, nil, OnePeer, []string{"a"}, true, true},
		{"one: none acked", peerState{"a": StateDeadletter, "b": StateDeadletter}, nil, OnePeer, nil, false, false},
		{"one: non-required peer in flight blocks", peerState{"a": StateAcked, "b": StateAcked, "x": StateInflight}, nil, OnePeer, []string{"a", "b"}, true, false},
		{"all: non-required peer failed does not block", peerState{"a": StateAcked, "b": StateAcked, "x": StateFailed}, nil, AllPeers, []string{"a", "b"}, true, true},
		{"one: no required peers", peerState{"a": StateAcked}, []string{}, OnePeer, nil, false, false},
		{"all: duplicate required ids", peerState{"a": StateAcked, "b": StateAcked}, []string{"b", "a", "b"}, AllPeers, []string{"a", "b"}, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newLedger(t, &bolt.Options{NoSync: true})
			for _, p := range slices.Sorted(maps.Keys(tc.states)) {
				putState(t, f.l, "s", p, tc.states[p])
			}
			// A different segment's records must not matter.
			putState(t, f.l, "s2", "a", StateInflight)
			req := tc.required
			if req == nil {
				req = []string{"a", "b"}
			}
			a := must[Assurance](t)(f.l.Assurance("s", req, tc.cond))
			if !slices.Equal(a.AckedPeers, tc.acked) || a.Met != tc.met {
				t.Fatalf("Assurance = %+v, want acked %v met %v", a, tc.acked, tc.met)
			}
			if got := must[bool](t)(f.l.CanEvict("s", req, tc.cond)); got != tc.evict {
				t.Fatalf("CanEvict = %v, want %v", got, tc.evict)
			}
			err := f.db.View(f.l.EvictionGate("s", req, tc.cond))
			if tc.evict != (err == nil) || (err != nil && !errors.Is(err, ErrEvictionBlocked)) {
				t.Fatalf("EvictionGate = %v, want allowed=%v", err, tc.evict)
			}
		})
	}
}

func TestUnknownCondition(t *testing.T) {
	f := newLedger(t, nil)
	if _, err := f.l.Assurance("s", []string{"a"}, "most"); !errors.Is(err, ErrUnknownCondition) {
		t.Fatalf("Assurance: %v", err)
	}
	if err := f.db.View(f.l.EvictionGate("s", []string{"a"}, "")); !errors.Is(err, ErrUnknownCondition) {
		t.Fatalf("EvictionGate: %v", err)
	}
}

func TestEvictionGateNeedsLedgerBuckets(t *testing.T) {
	f := newLedger(t, nil)
	other := newLedger(t, nil)
	// A gate from one ledger run in a transaction of a database without
	// ledger buckets must refuse, not allow.
	db2 := other.db
	if err := db2.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(rootBucket) }); err != nil {
		t.Fatal(err)
	}
	if err := db2.View(f.l.EvictionGate("s", []string{"a"}, OnePeer)); err == nil {
		t.Fatal("gate allowed eviction without a ledger")
	}
	if _, err := Open(db2); err != nil { // restore for the cleanup check
		t.Fatal(err)
	}
}

// putState drives (seg, peer) to state s through legal transitions only.
func putState(t *testing.T, l *Ledger, seg, peer string, s State) {
	t.Helper()
	must[[]string](t)(l.EnsureScheduled(seg, []string{peer}, t0))
	if s == StateScheduled {
		return
	}
	claimOK(t, l, seg, peer, t0)
	switch s {
	case StateAcked:
		must[Record](t)(l.TransitionAcked(seg, peer, t0))
	case StateFailed:
		must[Record](t)(l.TransitionFailed(seg, peer, errors.New("e"), t0, testPolicy))
	case StateDeadletter:
		must[Record](t)(l.TransitionFailed(seg, peer, errors.New("e"), t0, Policy{MaxRetries: 1, Initial: time.Second, Max: time.Second}))
	}
}
