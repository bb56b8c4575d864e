package relaycore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/internal/layout"
)

// savePages returns the source's row pages, to put them back later and so
// simulate a redelivery (a crash after target apply, before cleanup).
func (e *env) savePages(source relaycore.Partition) []relaycore.Item {
	var out []relaycore.Item
	for _, it := range e.src.Dump()[source] {
		if strings.HasPrefix(it.Key, layout.PagePrefix) {
			out = append(out, it)
		}
	}
	if len(out) == 0 {
		e.t.Fatal("no pages to save")
	}
	return out
}

// restorePages puts saved pages back and drops rs, so the next fire starts
// a cycle from the head and meets the already-delivered rows again.
func (e *env) restorePages(source relaycore.Partition, pages []relaycore.Item) {
	e.t.Helper()
	b := relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyRS, Delete: true}}}
	for _, it := range pages {
		b.Writes = append(b.Writes, relaycore.Write{Key: it.Key, Value: it.Value})
	}
	if err := e.src.Apply(e.ctx, source, b); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) fire(source relaycore.Partition) relaycore.FireResult {
	e.t.Helper()
	r, err := e.h.Fire(e.ctx, source)
	if err != nil {
		e.t.Fatalf("fire: %v", err)
	}
	return r
}

func TestRegressionDeleteAfterPutAndIdempotentRedelivery(t *testing.T) {
	for _, rowsPerFire := range []int{1, 256} {
		t.Run(map[int]string{1: "one row per fire", 256: "one batch"}[rowsPerFire], func(t *testing.T) {
			e := newEnv(t, "free")
			e.h.Budget.RowsPerFire = rowsPerFire
			e.enqueue(put("t", "k", "v1", "other", "x"))
			e.enqueue(del("t", "k"))
			saved := e.savePages(e.source)
			e.drain(e.source, 20)
			if _, ok := e.target("t", "k"); ok {
				t.Fatal("k exists after put then delete: delete was not ordered after put")
			}
			if v, _ := e.target("t", "other"); v != "x" {
				t.Fatalf("other = %q", v)
			}
			applies := e.countTargetApplies()
			e.restorePages(e.source, saved)
			for i := 0; i < 4; i++ {
				e.fire(e.source)
			}
			if *applies != 0 {
				t.Fatalf("redelivery made %d target batches, want 0", *applies)
			}
			if _, ok := e.target("t", "k"); ok {
				t.Fatal("redelivery resurrected k")
			}
			if rows := e.inspect(e.source).Rows(); len(rows) != 0 {
				t.Fatalf("redelivered rows not cleaned: %d left", len(rows))
			}
		})
	}
}

func TestRegressionDuplicateDeliveryKeepsNewerValue(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "k", "old"))
	saved := e.savePages(e.source) // the outbox holding only the old row
	e.drain(e.source, 10)
	e.enqueue(put("t", "k", "new"))
	e.drain(e.source, 10)
	applies := e.countTargetApplies()
	e.restorePages(e.source, saved)
	r := e.fire(e.source)
	// The carried rh (rs was dropped: none) guards one batch, which its
	// precondition refuses; the read that follows finds the row applied.
	if *applies != 0 || r.TargetCalls != 1 || r.TargetReads != 1 {
		t.Fatalf("duplicate delivery landed %d target batches (%d calls, %d rh reads), want 0 (1 refused, 1 read)", *applies, r.TargetCalls, r.TargetReads)
	}
	if v, _ := e.target("t", "k"); v != "new" {
		t.Fatalf("k = %q after duplicate delivery, want the newer value", v)
	}
	if r.RowsCleaned != 1 {
		t.Fatalf("cleaned %d rows, want 1", r.RowsCleaned)
	}
}

func TestRegressionCrashAfterTargetApplyRetriesCleanupOnly(t *testing.T) {
	for _, mode := range []string{"checkpoint fails", "checkpoint response lost"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, "free")
			e.enqueue(put("t1", "a", "1"), put("t2", "b", "2"), put("t1", "a", "3"))
			checkpoint := func(c call) bool {
				return c.Op == "apply" && c.P == e.source && len(c.Batch.Writes) > 1 // rs + page deletes
			}
			crashed := false
			if mode == "checkpoint fails" {
				e.srcF.set(func(c call) error {
					if checkpoint(c) && !crashed {
						crashed = true
						return errInjected
					}
					return nil
				}, nil)
				if _, err := e.h.Fire(e.ctx, e.source); !errors.Is(err, errInjected) {
					t.Fatalf("fire err = %v, want the injected crash", err)
				}
				if got := len(e.inspect(e.source).Rows()); got != 3 {
					t.Fatalf("%d rows in outbox after crash, want 3", got)
				}
				// The crashed fire's claim must lapse before another fire may run.
				e.clock.Advance(e.h.ClaimTTLOrDefault())
			} else {
				e.srcF.set(nil, func(c call) error {
					if checkpoint(c) && !crashed {
						crashed = true
						return maybeApplied()
					}
					return nil
				})
				e.fire(e.source)
			}
			e.srcF.set(nil, nil)
			applies := e.countTargetApplies()
			e.drain(e.source, 10)
			if mode == "checkpoint fails" && *applies != 0 {
				t.Fatalf("cleanup retry re-applied %d target batches, want 0", *applies)
			}
			if v, _ := e.target("t1", "a"); v != "3" {
				t.Fatalf("t1/a = %q", v)
			}
			if rows := e.inspect(e.source).Rows(); len(rows) != 0 {
				t.Fatalf("%d rows left", len(rows))
			}
		})
	}
}

func TestRegressionIdenticalRowsFromTwoSourcesSurviveRedelivery(t *testing.T) {
	e := newEnv(t, "free")
	a, b := relaycore.Partition("src-a"), relaycore.Partition("src-b")
	e.enqueueFrom(a, put("t", "k", "same"))
	e.enqueueFrom(b, put("t", "k", "same"))
	savedA, savedB := e.savePages(a), e.savePages(b)
	applies := e.countTargetApplies()
	e.drain(a, 10)
	e.drain(b, 10)
	if *applies != 2 {
		t.Fatalf("%d target batches, want one per source", *applies)
	}
	for _, s := range []relaycore.Partition{a, b} {
		if rh, err := relaycore.TargetWatermark(e.ctx, e.tgt, "t", s); err != nil || rh != 1 {
			t.Fatalf("rh(t,%s) = %d, %v; want 1", s, rh, err)
		}
	}
	e.restorePages(a, savedA)
	e.restorePages(b, savedB)
	e.drain(a, 10)
	e.drain(b, 10)
	if *applies != 2 {
		t.Fatalf("redelivery added target batches: %d", *applies-2)
	}
	if v, _ := e.target("t", "k"); v != "same" {
		t.Fatalf("k = %q", v)
	}
}

func TestRegressionConcurrentDelivererAdvancesRHFirst(t *testing.T) {
	for _, ahead := range []uint64{1, 3} {
		t.Run(map[uint64]string{1: "partly", 3: "fully"}[ahead], func(t *testing.T) {
			e := newEnv(t, "free")
			e.enqueue(put("t", "k", "v1"), put("t", "k", "v2"), put("t", "k", "v3"))
			raced := false
			e.tgtF.set(func(c call) error {
				if c.Op != "apply" || raced {
					return nil
				}
				raced = true
				// Another deliverer applies rows through seq `ahead` first.
				vals := map[uint64]string{1: "v1", 3: "v3"}
				return e.tgt.Apply(e.ctx, "t", relaycore.Batch{
					Preconditions: []relaycore.Precondition{{Key: relaycore.RHKey(e.source), Absent: true}},
					Writes: []relaycore.Write{
						{Key: "k", Value: []byte(vals[ahead])},
						{Key: relaycore.RHKey(e.source), Value: []byte{'0' + byte(ahead)}},
					},
				})
			}, nil)
			// Our batch is sent after the racer's (the before hook ran it):
			// the rh guard fails and the fire must re-read rh.
			r := e.fire(e.source)
			e.tgtF.set(nil, nil)
			if ahead == 3 && r.TargetCalls != 1 {
				t.Fatalf("%d target calls, want 1 (rows covered by the racer need none)", r.TargetCalls)
			}
			if ahead == 1 && r.TargetCalls != 2 {
				t.Fatalf("%d target calls, want 2 (retry with rows 2..3)", r.TargetCalls)
			}
			if v, _ := e.target("t", "k"); v != "v3" {
				t.Fatalf("k = %q, want v3", v)
			}
			if rh, _ := relaycore.TargetWatermark(e.ctx, e.tgt, "t", e.source); rh != 3 {
				t.Fatalf("rh = %d", rh)
			}
			if rows := e.inspect(e.source).Rows(); len(rows) != 0 {
				t.Fatalf("%d rows left", len(rows))
			}
		})
	}
}

func TestRegressionRSGuardConflictFireRetries(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t1", "a", "1"), put("t2", "b", "2"))
	sourceApplies := 0
	e.srcF.set(func(c call) error {
		if c.Op != "apply" || c.P != e.source {
			return nil
		}
		sourceApplies++
		if sourceApplies != 2 { // 1 = claim, 2 = first checkpoint
			return nil
		}
		// A competitor rewrites rs (its claim already released).
		raw, _, _ := e.src.Get(e.ctx, e.source, relaycore.KeyRS)
		return e.src.Apply(e.ctx, e.source, relaycore.Batch{
			Preconditions: []relaycore.Precondition{{Key: relaycore.KeyRS, Value: raw}},
			Writes:        []relaycore.Write{{Key: relaycore.KeyRS, Value: []byte(`{"ver":99,"cycle_end":0,"cursor":0}`)}},
		})
	}, nil)
	applies := 0
	e.tgtF.set(func(c call) error {
		if c.Op == "apply" {
			applies++
		}
		return nil
	}, nil)
	r := e.fire(e.source)
	if r.Retries != 1 {
		t.Fatalf("retries = %d, want 1", r.Retries)
	}
	if applies != 2 {
		t.Fatalf("%d target batches, want 2 (the retry finds rh covering the rows)", applies)
	}
	if rows := e.inspect(e.source).Rows(); len(rows) != 0 {
		t.Fatalf("%d rows left after the retried checkpoint", len(rows))
	}
}

func TestRegressionAppendWhileDrainingKeepsWakeUp(t *testing.T) {
	e := newEnv(t, "free")
	e.enqueue(put("t", "a", "1"))
	appended := false
	e.srcF.set(nil, func(c call) error {
		// The alarm's emptiness check (pages range, limit 1) has just seen an
		// empty outbox: an append lands before the alarm is cleared.
		if c.Op == "scan" && c.Key == layout.PagePrefix && !appended && len(e.inspect(e.source).Rows()) == 0 {
			appended = true
			e.enqueue(put("t", "b", "2"))
		}
		return nil
	})
	ar, err := e.h.Alarm(e.ctx, e.source)
	if err != nil {
		t.Fatal(err)
	}
	e.srcF.set(nil, nil)
	if !appended {
		t.Fatal("the append was not injected")
	}
	if ar.Cleared {
		t.Fatal("alarm cleared although an append landed: its wake-up is lost")
	}
	if e.inspect(e.source).Alarm == nil {
		t.Fatal("no alarm record after the append")
	}
	e.drain(e.source, 10)
	if v, _ := e.target("t", "b"); v != "2" {
		t.Fatalf("appended row not delivered: b = %q", v)
	}
}
