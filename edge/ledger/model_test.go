package ledger

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

var modelSeed = flag.Uint64("ledger.seed", 0, "run TestModel with only this seed")

// TestModel runs seeded random operation sequences against the ledger and
// against a plain in-memory model written from the package documentation,
// comparing every record and the pending scan after each step. A failure
// prints the seed; rerun with -ledger.seed=N.
func TestModel(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 0xdecaf, 20261129}
	if *modelSeed != 0 {
		seeds = []uint64{*modelSeed}
	}
	steps := 400
	if testing.Short() {
		steps = 100
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Logf("seed %d (rerun: go test ./edge/ledger -run TestModel -ledger.seed=%d)", seed, seed)
			runModel(t, seed, steps)
		})
	}
}

type model struct {
	recs map[[2]string]Record
}

func (m *model) sorted() []Record {
	out := make([]Record, 0, len(m.recs))
	for _, r := range m.recs {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Record) int {
		return strings.Compare(a.SegmentID+"\x00"+a.PeerID, b.SegmentID+"\x00"+b.PeerID)
	})
	return out
}

func (m *model) fail(r Record, cause string, now time.Time, p Policy) Record {
	r.LastError, r.UpdatedAt = cause, now
	if r.Attempts-r.BudgetBase >= p.MaxRetries {
		r.State, r.NextAttemptAfter = StateDeadletter, time.Time{}
	} else {
		r.State, r.NextAttemptAfter = StateFailed, now.Add(p.Backoff(r.Attempts-r.BudgetBase))
	}
	return r
}

func runModel(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	f := newLedger(t, &bolt.Options{NoSync: true})
	l := f.l
	m := &model{recs: map[[2]string]Record{}}
	segs := []string{"a", "ab", "b", "c"}
	peers := []string{"p", "q", "r"}
	present := map[string]bool{"a": true, "ab": true, "b": true, "c": true}
	now := t0
	p := Policy{MaxRetries: 3, Initial: time.Second, Max: 4 * time.Second}
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }

	seen := map[string]int{}
	for step := 0; step < steps; step++ {
		// Weighted choice; claim, ack and fail are aimed, most of the time,
		// at a record in a state where they succeed.
		op := []int{0, 0, 1, 1, 2, 2, 2, 4, 4, 4, 5, 5, 5, 6, 7, 8, 9, 10}[rng.IntN(18)]
		seg, peer := pick(segs), pick(peers)
		var aim []Record
		for _, r := range m.sorted() {
			switch {
			case op == 2 && (r.State == StateScheduled || r.State == StateFailed && !r.NextAttemptAfter.After(now)),
				(op == 4 || op == 5) && r.State == StateInflight:
				aim = append(aim, r)
			}
		}
		if len(aim) > 0 && rng.IntN(5) > 0 {
			r := aim[rng.IntN(len(aim))]
			seg, peer = r.SegmentID, r.PeerID
		}
		k := [2]string{seg, peer}
		r, has := m.recs[k]
		var desc string
		var err error
		wantErr := false
		switch op {
		case 0:
			desc = "advance clock"
			now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		case 1:
			desc = "EnsureScheduled"
			_, err = l.EnsureScheduled(seg, []string{peer}, now)
			if !has {
				m.recs[k] = Record{SegmentID: seg, PeerID: peer, State: StateScheduled, NextAttemptAfter: now, UpdatedAt: now}
			}
		case 2:
			desc = "TryTransitionInflight"
			var claimed bool
			_, claimed, err = l.TryTransitionInflight(seg, peer, now)
			want := has && (r.State == StateScheduled || r.State == StateFailed && !r.NextAttemptAfter.After(now))
			wantErr = !has || r.State.Terminal()
			if claimed != want {
				t.Fatalf("step %d: claim %s/%s = %v, model says %v (record %+v)", step, seg, peer, claimed, want, r)
			}
			if want {
				r.State, r.Attempts, r.NextAttemptAfter, r.UpdatedAt = StateInflight, r.Attempts+1, time.Time{}, now
				m.recs[k] = r
			}
		case 4:
			desc = "TransitionAcked"
			_, err = l.TransitionAcked(seg, peer, now)
			wantErr = !has || r.State != StateInflight
			if !wantErr {
				r.State, r.LastError, r.UpdatedAt = StateAcked, "", now
				m.recs[k] = r
			}
		case 5:
			desc = "TransitionFailed"
			cause := fmt.Sprintf("fail at step %d", step)
			_, err = l.TransitionFailed(seg, peer, errors.New(cause), now, p)
			wantErr = !has || r.State != StateInflight
			if !wantErr {
				m.recs[k] = m.fail(r, cause, now, p)
			}
		case 6:
			desc = "RetryDeadletter"
			if rng.IntN(2) == 0 {
				peer = ""
			}
			_, err = l.RetryDeadletter(seg, peer, now)
			if peer != "" {
				wantErr = !has || r.State != StateDeadletter
			}
			for mk, mr := range m.recs {
				if !wantErr && mk[0] == seg && (peer == "" || mk[1] == peer) && mr.State == StateDeadletter {
					mr.State, mr.BudgetBase, mr.NextAttemptAfter, mr.UpdatedAt = StateScheduled, mr.Attempts, now, now
					m.recs[mk] = mr
				}
			}
		case 7:
			desc = "Purge"
			_, err = l.Purge("", peer)
			for mk, mr := range m.recs {
				if mk[1] == peer && mr.State == StateDeadletter {
					delete(m.recs, mk)
				}
			}
		case 8:
			desc = "InflightToFailed"
			_, err = l.InflightToFailed(now, p)
			for mk, mr := range m.recs {
				if mr.State == StateInflight {
					m.recs[mk] = m.fail(mr, "attempt abandoned: agent stopped while in flight", now, p)
				}
			}
		case 9:
			desc = "PruneMissing"
			if rng.IntN(3) == 0 {
				present[seg] = !present[seg]
			}
			_, err = l.PruneMissing(func(s string) bool { return present[s] }, now)
			for mk, mr := range m.recs {
				if !present[mk[0]] && !mr.State.Terminal() {
					mr.State, mr.NextAttemptAfter, mr.UpdatedAt, mr.LastError = StateDeadletter, time.Time{}, now, "segment missing from local store"
					m.recs[mk] = mr
				}
			}
		case 10:
			desc = "RescheduleReady"
			_, err = l.RescheduleReady(now)
			for mk, mr := range m.recs {
				if mr.State == StateFailed && !mr.NextAttemptAfter.After(now) {
					mr.State, mr.UpdatedAt = StateScheduled, now
					m.recs[mk] = mr
				}
			}
		}
		if wantErr != (err != nil) {
			t.Fatalf("step %d %s %s/%s: err = %v, want error: %v", step, desc, seg, peer, err, wantErr)
		}
		if err != nil && !errors.Is(err, ErrIllegalTransition) && !errors.Is(err, ErrNotFound) {
			t.Fatalf("step %d %s: unexpected error kind %v", step, desc, err)
		}
		compare(t, step, desc, l, m, now)
		seen[desc]++
		if err == nil {
			seen[desc+" ok"]++
		}
	}
	// Guard against a generator that never reaches the interesting paths.
	for _, d := range []string{"TryTransitionInflight ok", "TransitionAcked ok", "TransitionFailed ok", "RetryDeadletter ok", "PruneMissing ok"} {
		if seen[d] == 0 && steps >= 400 {
			t.Errorf("generator never ran %s", d)
		}
	}
	t.Logf("operations: %v", seen)
}

func compare(t *testing.T, step int, desc string, l *Ledger, m *model, now time.Time) {
	t.Helper()
	got, want := allRecords(t, l), m.sorted()
	if len(got) != len(want) {
		t.Fatalf("step %d %s: %d records, model %d", step, desc, len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.SegmentID != w.SegmentID || g.PeerID != w.PeerID || g.State != w.State || g.Attempts != w.Attempts ||
			g.BudgetBase != w.BudgetBase || !g.NextAttemptAfter.Equal(w.NextAttemptAfter) || g.LastError != w.LastError || !g.UpdatedAt.Equal(w.UpdatedAt) {
			t.Fatalf("step %d %s: record\n got   %+v\n model %+v", step, desc, g, w)
		}
	}
	var due []Record
	for _, r := range want {
		if (r.State == StateScheduled || r.State == StateFailed) && !r.NextAttemptAfter.After(now) {
			due = append(due, r)
		}
	}
	slices.SortStableFunc(due, func(a, b Record) int { return a.NextAttemptAfter.Compare(b.NextAttemptAfter) })
	pend := must[[]Record](t)(l.Pending(now, 0))
	if keys(pend) != keys(due) {
		t.Fatalf("step %d %s: Pending\n got   %s\n model %s", step, desc, keys(pend), keys(due))
	}
}
