package storetest

import (
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

func concurrencyCases() []suiteCase {
	return []suiteCase{
		{"CASIncrements", casIncrements},
		{"DisjointPartitions", disjointPartitions},
	}
}

// casIncrements runs workers that each make attempts compare-and-swap
// increments of one counter. Every successful batch also creates a marker
// for the version it wrote, guarded by Absent on the marker, so two
// winners for one version would either both create the marker (caught by
// the recorded versions) or one would fail on it.
//
// Invariants: the counter equals the number of successful Applys; the
// winners' versions are exactly 1..counter, each once; the markers are
// exactly those versions. The check needs no timing: it holds for any
// interleaving.
func casIncrements(t *testing.T, s relaycore.Store) {
	const workers, attempts = 8, 15
	const p, counter = relaycore.Partition("cas"), "n"
	var (
		mu      sync.Mutex
		won     = map[int]int{} // version -> worker
		wg      sync.WaitGroup
		errs    = make(chan error, workers)
		ctx     = t.Context()
		lostAll = 0
	)
	for w := range workers {
		wg.Go(func() {
			lost := 0
			for range attempts {
				v, ok, err := s.Get(ctx, p, counter)
				if err != nil {
					errs <- fmt.Errorf("worker %d get: %w", w, err)
					return
				}
				cur := 0
				pc := absent(counter)
				if ok {
					if cur, err = strconv.Atoi(string(v)); err != nil {
						errs <- fmt.Errorf("worker %d: counter holds %q", w, v)
						return
					}
					pc = relaycore.Precondition{Key: counter, Value: v}
				}
				next := cur + 1
				marker := fmt.Sprintf("v%06d", next)
				b := relaycore.Batch{
					Preconditions: []relaycore.Precondition{pc, absent(marker)},
					Writes:        []relaycore.Write{put(counter, strconv.Itoa(next)), put(marker, strconv.Itoa(w))},
				}
				err = s.Apply(ctx, p, b)
				if _, failed := relaycore.FailedPrecondition(err); failed {
					lost++
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d apply version %d: %w", w, next, err)
					return
				}
				mu.Lock()
				if prev, dup := won[next]; dup {
					mu.Unlock()
					errs <- fmt.Errorf("version %d won by workers %d and %d", next, prev, w)
					return
				}
				won[next] = w
				mu.Unlock()
			}
			mu.Lock()
			lostAll += lost
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	v, ok := mustGet(t, s, p, counter)
	final, err := strconv.Atoi(string(v))
	if !ok || err != nil {
		t.Fatalf("counter = %q, %v", v, ok)
	}
	t.Logf("%d workers x %d attempts: %d increments won, %d lost to a concurrent writer", workers, attempts, len(won), lostAll)
	if final != len(won) {
		t.Fatalf("counter = %d, but %d Applys succeeded", final, len(won))
	}
	if len(won)+lostAll != workers*attempts {
		t.Fatalf("%d won + %d lost != %d attempts", len(won), lostAll, workers*attempts)
	}
	markers := scanAll(t, s, p, relaycore.ScanRequest{Start: "v", End: "w", Limit: 50})
	if len(markers) != final {
		t.Fatalf("%d markers for %d versions", len(markers), final)
	}
	for i, m := range markers {
		if want := fmt.Sprintf("v%06d", i+1); m.Key != want {
			t.Fatalf("marker %d is %q, want %q", i, m.Key, want)
		}
		if want := strconv.Itoa(won[i+1]); string(m.Value) != want {
			t.Fatalf("marker %s names worker %s, but worker %s won it", m.Key, m.Value, want)
		}
	}
}

// disjointPartitions checks that concurrent batches on different partitions
// do not interfere: each worker's guarded chain in its own partition must
// never see a condition failure.
func disjointPartitions(t *testing.T, s relaycore.Store) {
	const workers, steps = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		p := relaycore.Partition(fmt.Sprintf("w%d", w))
		wg.Go(func() {
			prev := relaycore.Precondition{Key: "n", Absent: true}
			for i := range steps {
				val := strconv.Itoa(i)
				err := s.Apply(t.Context(), p, relaycore.Batch{
					Preconditions: []relaycore.Precondition{prev},
					Writes:        []relaycore.Write{put("n", val), put("step"+val, val)},
				})
				if err != nil {
					errs <- fmt.Errorf("partition %s step %d: %w", p, i, err)
					return
				}
				prev = is("n", val)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for w := range workers {
		p := relaycore.Partition(fmt.Sprintf("w%d", w))
		wantValue(t, s, p, "n", strconv.Itoa(steps-1))
		if got := snapshot(t, s, p); len(got) != steps+1 {
			t.Fatalf("partition %s has %d keys, want %d", p, len(got), steps+1)
		}
	}
}
