//go:build unix

package rietest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/relaycore"
)

// enqueueWide enqueues one row for each of n targets through the api
// function and returns the rows and their sequence numbers.
func enqueueWide(t *testing.T, apiFn *function, n int) ([]api.RowJSON, []uint64) {
	t.Helper()
	rows := make([]api.RowJSON, n)
	for i := range rows {
		v := b64(fmt.Sprintf("v%d", i))
		rows[i] = api.RowJSON{Target: fmt.Sprintf("t%03d", i), Puts: []api.PutJSON{{Key: "k", Value: &v}}}
	}
	body, err := json.Marshal(enqueuedRows{Rows: rows})
	if err != nil {
		t.Fatal(err)
	}
	var enq api.EnqueueResponse
	apiCall(t, apiFn, withPath(t, "POST", "/v1/sources/orders/rows", "", string(body)), 200, &enq)
	if len(enq.Seqs) != n {
		t.Fatalf("enqueue response %+v", enq)
	}
	return rows, enq.Seqs
}

// chain plays Lambda's async invocation queue for the fire function: it
// invokes payload under the emulator and, while an invocation reports that
// it continued, relays the async invoke the bootstrap sent to the
// recording Lambda endpoint to the emulator, one at a time (the emulator
// runs one invocation at a time; Lambda would start another environment).
func (r *rig) chain(f *function, payload []byte) []fire.Result {
	t := r.t
	t.Helper()
	lam := r.lam[f.id]
	var out []fire.Result
	for {
		var res fire.Result
		f.invokeOK(t, payload, &res)
		out = append(out, res)
		if !res.Continued {
			return out
		}
		if len(out) > 2*fire.MaxContinuationHops {
			t.Fatalf("chain of %d invocations: %+v", len(out), out)
		}
		select {
		case inv := <-lam.C:
			if inv.Hop != res.Hop+1 || inv.Source != res.Source {
				t.Fatalf("hop %d of %s continued with %+v", res.Hop, res.Source, inv)
			}
			payload = inv.Payload
		case <-time.After(30 * time.Second):
			// The invoke was accepted before the invocation returned, so
			// it is already queued; this only bounds a broken endpoint.
			t.Fatalf("hop %d reported a continuation that never reached the Lambda endpoint", res.Hop)
		}
	}
}

// checkAppliedOnce: every target's rh was written exactly once with the
// row's seq, so no target batch was applied twice across the chain.
func (r *rig) checkAppliedOnce(rows []api.RowJSON, seqs []uint64) {
	r.t.Helper()
	writes := r.rhWrites("orders")
	for i, row := range rows {
		if got, want := writes[row.Target], []string{strconv.FormatUint(seqs[i], 10)}; !slices.Equal(got, want) {
			r.t.Errorf("target %s rh writes %v, want %v", row.Target, got, want)
		}
	}
}

// TestContinuationDrainsWithoutScheduler: a backlog of four free alarms
// (60 targets, 16 per alarm) drains from one scheduled invocation through
// three self-invocations, relayed from the recording Lambda endpoint to the
// emulator; no schedule runs. Each alarm still armed its schedule (the
// fast path stays best effort), every row is delivered once, and the fire
// function's invokes are within its IAM grant (checkGrants).
func TestContinuationDrainsWithoutScheduler(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	// DRAIN_SLICE 0s: one alarm per invocation, so every alarm after the
	// first is a hop (TestDrainSliceUnderEmulator has the default).
	fireFn := r.start("FireFunction", map[string]string{"CONTINUATION_HOPS": strconv.Itoa(fire.DefaultMaxHops), "DRAIN_SLICE": "0s"})
	rows, seqs := enqueueWide(t, apiFn, 60)

	results := r.chain(fireFn, readEvent(t, "fire.json"))
	if len(results) != 4 {
		t.Fatalf("%d invocations, want 4 (one per alarm): %+v", len(results), results)
	}
	delivered := 0
	for i, res := range results {
		delivered += res.RowsDelivered
		if res.Hop != i || res.Busy || (i < 3 && res.Fires != 2) {
			t.Errorf("invocation %d: %+v", i, res)
		}
	}
	if last := results[3]; !last.Cleared || last.Continued {
		t.Errorf("last invocation %+v, want the alarm cleared and no continuation", last)
	}
	if delivered != len(rows) {
		t.Errorf("%d rows delivered, want %d", delivered, len(rows))
	}
	r.checkDelivered("orders", rows, seqs)
	r.checkAppliedOnce(rows, seqs)
	if st := r.sched.Stats(); st.Created == 0 {
		t.Errorf("scheduler %+v: re-arms must still kick their schedules", st)
	}
	var hops []int
	for _, inv := range r.lam["FireFunction"].Accepted() {
		hops = append(hops, inv.Hop)
	}
	if !slices.Equal(hops, []int{1, 2, 3}) {
		t.Errorf("async invokes with hops %v, want [1 2 3]", hops)
	}
	if v, err := relaycore.InspectSource(t.Context(), r.source, "orders"); err != nil || v.Alarm != nil || len(v.Pages) != 0 {
		t.Errorf("source after the chain: alarm %v, %d pages, %v", v.Alarm, len(v.Pages), err)
	}
}

// TestDrainSliceUnderEmulator: with the template's DRAIN_SLICE (5 s) one
// scheduled invocation runs the four alarms of the backlog itself, one
// after another, and invokes nothing: each alarm still arms its schedule,
// every row is delivered once.
func TestDrainSliceUnderEmulator(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	fireFn := r.start("FireFunction", map[string]string{"CONTINUATION_HOPS": strconv.Itoa(fire.DefaultMaxHops)})
	rows, seqs := enqueueWide(t, apiFn, 60)

	results := r.chain(fireFn, readEvent(t, "fire.json"))
	if len(results) != 1 {
		t.Fatalf("%d invocations, want 1: %+v", len(results), results)
	}
	if res := results[0]; res.Alarms != 4 || res.Fires != 8 || res.RowsDelivered != len(rows) || !res.Cleared || res.Continued {
		t.Errorf("invocation %+v, want 4 alarms of 2 fires delivering %d rows, cleared, no continuation", res, len(rows))
	}
	r.checkDelivered("orders", rows, seqs)
	r.checkAppliedOnce(rows, seqs)
	if st := r.sched.Stats(); st.Created == 0 {
		t.Errorf("scheduler %+v: re-arms must still kick their schedules", st)
	}
	if n := len(r.lam["FireFunction"].Accepted()); n != 0 {
		t.Errorf("%d async invokes, want none", n)
	}
}

// TestContinuationBoundedByHops: with CONTINUATION_HOPS=1 a chain is two
// invocations; the second re-arms and stops, and the source is finished by
// the schedules its alarms armed (hop-0 events starting new chains).
func TestContinuationBoundedByHops(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	fireFn := r.start("FireFunction", map[string]string{"CONTINUATION_HOPS": "1", "DRAIN_SLICE": "0s"})
	rows, seqs := enqueueWide(t, apiFn, 60)
	r.sched.TakeAll() // the enqueue's kick: this test starts the chain itself

	first := r.chain(fireFn, readEvent(t, "fire.json"))
	if len(first) != 2 || first[1].Cleared || first[1].NextDueMS == 0 {
		t.Fatalf("first chain %+v, want two invocations ending with a re-armed alarm", first)
	}
	chains := 1
	for done := false; !done; chains++ {
		if chains > 10 {
			t.Fatal("not drained after 10 chains")
		}
		due := r.sched.TakeAll()
		if len(due) == 0 {
			t.Fatal("rows remain but no schedule is armed: the chain's end was not handed to Scheduler")
		}
		for _, sc := range due {
			if sc.Input != `{"source":"orders"}` {
				t.Fatalf("schedule input %s: schedules start chains at hop 0", sc.Input)
			}
			res := r.chain(fireFn, []byte(sc.Input))
			done = done || res[len(res)-1].Cleared
		}
	}
	for _, inv := range r.lam["FireFunction"].Accepted() {
		if inv.Hop > 1 {
			t.Errorf("async invoke with hop %d beyond CONTINUATION_HOPS=1", inv.Hop)
		}
	}
	r.checkDelivered("orders", rows, seqs)
	r.checkAppliedOnce(rows, seqs)

	// events/fire-continuation.json on the drained source: a late
	// continuation finds nothing, clears and does not continue.
	var late fire.Result
	fireFn.invokeOK(t, readEvent(t, "fire-continuation.json"), &late)
	if late.Hop != 1 || !late.Cleared || late.Continued || late.RowsDelivered != 0 {
		t.Errorf("late continuation %+v, want hop 1, cleared, nothing delivered", late)
	}
}
