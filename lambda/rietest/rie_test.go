//go:build unix

package rietest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/relay-dev/relay/infra/scheduler"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/lambda/sweep"
	"github.com/relay-dev/relay/relaycore"
)

// enqueued is events/api-enqueue.json's rows, decoded for the checks.
type enqueuedRows struct {
	Rows []api.RowJSON `json:"rows"`
}

func sampleRows(t *testing.T) []api.RowJSON {
	t.Helper()
	var ev struct{ Body string }
	if err := json.Unmarshal(readEvent(t, "api-enqueue.json"), &ev); err != nil {
		t.Fatal(err)
	}
	var in enqueuedRows
	if err := json.Unmarshal([]byte(ev.Body), &in); err != nil {
		t.Fatal(err)
	}
	return in.Rows
}

// checkDelivered asserts every row's puts are at its target with their
// values, its deletes absent, and the target's rh for source is seq.
func (r *rig) checkDelivered(source relaycore.Partition, rows []api.RowJSON, seqs []uint64) {
	t := r.t
	t.Helper()
	last := map[relaycore.Partition]uint64{}
	for i, row := range rows {
		tgt := relaycore.Partition(row.Target)
		last[tgt] = max(last[tgt], seqs[i])
		for _, p := range row.Puts {
			want, _ := base64.StdEncoding.DecodeString(*p.Value)
			got, ok, err := r.target.Get(t.Context(), tgt, p.Key)
			if err != nil || !ok || string(got) != string(want) {
				t.Errorf("target %s key %s = %q (found %v, %v), want %q", tgt, p.Key, got, ok, err, want)
			}
		}
		for _, k := range row.Deletes {
			if _, ok, _ := r.target.Get(t.Context(), tgt, k); ok {
				t.Errorf("target %s key %s exists, the row deletes it", tgt, k)
			}
		}
	}
	for tgt, seq := range last {
		rh, err := relaycore.TargetWatermark(t.Context(), r.target, tgt, source)
		if err != nil || rh != seq {
			t.Errorf("target %s rh = %d (%v), want %d", tgt, rh, err, seq)
		}
	}
}

// TestEnqueueFireQuery: rows enqueued through the api function are
// delivered by the fire invocation their kick arms, and the api's queries
// report it. The kick here is the Scheduler-only one (FAST_KICK=false);
// fastkick_test.go covers the default.
func TestEnqueueFireQuery(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", map[string]string{"FAST_KICK": "false"})
	fireFn := r.start("FireFunction", nil)

	var enq api.EnqueueResponse
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq)
	if enq.Source != "orders" || !slices.Equal(enq.Seqs, []uint64{1, 2}) {
		t.Fatalf("enqueue response %+v", enq)
	}
	var dt api.DeliveredResponse
	apiCall(t, apiFn, readEvent(t, "api-query.json"), 200, &dt)
	if dt.Delivered || dt.Seq != 2 {
		t.Errorf("before any fire: %+v, want not delivered", dt)
	}

	// The enqueue kicked one alarm schedule; "run" it.
	scheds := r.sched.TakeAll()
	if len(scheds) != 1 || scheds[0].Name != scheduler.ScheduleName("orders", (enq.AlarmDueMS+999)/1000) {
		t.Fatalf("schedules after enqueue: %+v", scheds)
	}
	if scheds[0].TargetARN != r.env("ApiFunction", nil)["FIRE_FUNCTION_ARN"] || scheds[0].Input != `{"source":"orders"}` {
		t.Errorf("schedule target %s input %s", scheds[0].TargetARN, scheds[0].Input)
	}
	var fr fire.Result
	fireFn.invokeOK(t, []byte(scheds[0].Input), &fr)
	if fr.RowsDelivered != 2 || !fr.Cleared || fr.Busy {
		t.Fatalf("fire result %+v, want 2 rows delivered and the alarm cleared", fr)
	}
	r.checkDelivered("orders", sampleRows(t), enq.Seqs)
	if p := r.sched.Pending(); len(p) != 0 {
		t.Errorf("a drained source re-armed: %+v", p)
	}

	apiCall(t, apiFn, readEvent(t, "api-query.json"), 200, &dt)
	if !dt.Delivered {
		t.Errorf("after the fire: %+v, want delivered", dt)
	}
	var st api.StateResponse
	apiCall(t, apiFn, readEvent(t, "api-state.json"), 200, &st)
	if !st.Empty || st.NextSeq != 3 {
		t.Errorf("state %+v, want empty with next seq 3", st)
	}
	var wm api.WatermarkResponse
	apiCall(t, apiFn, readEvent(t, "api-watermark.json"), 200, &wm)
	if wm.WatermarkMS < enq.AlarmDueMS {
		t.Errorf("watermark %d below the last commit %d", wm.WatermarkMS, enq.AlarmDueMS)
	}

	// events/fire.json again: a duplicate alarm finds nothing to do.
	fireFn.invokeOK(t, readEvent(t, "fire.json"), &fr)
	if fr.RowsDelivered != 0 || fr.TargetCalls != 0 {
		t.Errorf("duplicate fire %+v, want no target calls", fr)
	}
}

// TestLostKickHealedBySweep: the kick is lost (Lambda refuses the fast
// kick's invoke and Scheduler is down for its fallback); the enqueue still
// succeeds and the sweep, listing the overdue durable alarm through the
// due index, delivers the rows.
func TestLostKickHealedBySweep(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	sweepFn := r.start("SweepFunction", nil)

	r.sched.Fail(http.StatusInternalServerError)
	r.lam["ApiFunction"].Fail(http.StatusInternalServerError)
	var enq api.EnqueueResponse
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq)
	if n := len(r.sched.Pending()); n != 0 {
		t.Fatalf("%d schedules armed while Scheduler failed", n)
	}
	if st := r.sched.Stats(); st.Failed == 0 {
		t.Fatalf("scheduler stats %+v: the kick never reached it", st)
	}
	if st := r.lam["ApiFunction"].Stats(); st.Failed == 0 || st.Accepted != 0 {
		t.Fatalf("lambda stats %+v: the fast kick never reached it, or was queued", st)
	}
	r.sched.Fail(0)

	var sr sweep.Result
	sweepFn.invokeOK(t, readEvent(t, "sweep.json"), &sr)
	if sr.Listed != 1 || sr.Fired != 1 || sr.RowsDelivered != 2 || sr.Failed != 0 {
		t.Fatalf("sweep result %+v, want the one overdue alarm fired", sr)
	}
	r.checkDelivered("orders", sampleRows(t), enq.Seqs)
	if v, err := relaycore.InspectSource(t.Context(), r.source, "orders"); err != nil || v.Alarm != nil || len(v.Pages) != 0 {
		t.Errorf("source after the sweep: alarm %v, %d pages, %v", v.Alarm, len(v.Pages), err)
	}
	sweepFn.invokeOK(t, readEvent(t, "sweep.json"), &sr)
	if sr.Listed != 0 {
		t.Errorf("second sweep %+v, want nothing overdue", sr)
	}
}

// TestDuplicateFiresDeliverOnce: two emulators run the fire function for
// the same source at the same time, then the same event is redelivered,
// then the re-armed schedules run. Every row lands once: each target's rh
// writes increase strictly (no target batch applied twice), no target
// transaction was refused (no duplicate spent budget on the same rows),
// and the rows delivered across all invocations add up to the rows
// enqueued.
func TestDuplicateFiresDeliverOnce(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	fireA := r.start("FireFunction", nil)
	fireB := r.start("FireFunction", nil)

	// 24 targets × 2 rows: more than one free alarm (2 fires × 8 targets).
	var rows []api.RowJSON
	for round := range 2 {
		for i := range 24 {
			v := b64(fmt.Sprintf("v%d-%d", i, round))
			rows = append(rows, api.RowJSON{Target: fmt.Sprintf("t%02d", i), Puts: []api.PutJSON{{Key: "k", Value: &v}}})
		}
	}
	body, err := json.Marshal(enqueuedRows{Rows: rows})
	if err != nil {
		t.Fatal(err)
	}
	var enq api.EnqueueResponse
	apiCall(t, apiFn, withPath(t, "POST", "/v1/sources/orders/rows", "", string(body)), 200, &enq)
	// The engine groups rows by target; re-derive each row's value order.
	if len(enq.Seqs) != len(rows) {
		t.Fatalf("enqueue response %+v", enq)
	}

	fireEvent := readEvent(t, "fire.json")
	var (
		mu        sync.Mutex
		delivered int
		results   []fire.Result
	)
	run := func(f *function) {
		var fr fire.Result
		f.invokeOK(t, fireEvent, &fr)
		mu.Lock()
		delivered += fr.RowsDelivered
		results = append(results, fr)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, f := range []*function{fireA, fireB} {
		wg.Add(1)
		go func() { defer wg.Done(); run(f) }()
	}
	wg.Wait()
	run(fireA) // the same event again, after both finished
	for i := 0; i < 20; i++ {
		due := r.sched.TakeAll()
		if len(due) == 0 {
			break
		}
		for _, sc := range due {
			if sc.Input != string(fireEvent) && sc.Input != `{"source":"orders"}` {
				t.Fatalf("schedule input %s", sc.Input)
			}
			run(fireB)
		}
	}
	if delivered != len(rows) {
		t.Errorf("rows delivered across invocations = %d, want %d (%+v)", delivered, len(rows), results)
	}
	want := make([]api.RowJSON, 0, len(rows))
	for i := range 24 {
		// The newest row for each target wins: round 1.
		want = append(want, rows[24+i])
	}
	lastSeq := map[string]uint64{}
	for i, row := range rows {
		lastSeq[row.Target] = max(lastSeq[row.Target], enq.Seqs[i])
	}
	seqs := make([]uint64, len(want))
	for i, row := range want {
		seqs[i] = lastSeq[row.Target]
	}
	r.checkDelivered("orders", want, seqs)

	for tgt, writes := range r.rhWrites("orders") {
		prev := uint64(0)
		for _, w := range writes {
			v, err := strconv.ParseUint(w, 10, 64)
			if err != nil || v <= prev {
				t.Errorf("target %s rh writes %v: not strictly increasing, a batch was applied twice", tgt, writes)
				break
			}
			prev = v
		}
	}
	if got := len(r.rhWrites("orders")); got != 24 {
		t.Errorf("rh written at %d targets, want 24", got)
	}
	// Overlapping fires may race for the source's claim (a refused rs
	// compare-and-set is how one of them learns to step aside), but no
	// target batch may be refused: that would be budget spent twice.
	if sent, failed := r.txCount(targetTable); failed != 0 {
		t.Errorf("%d of %d target transactions refused: overlapping fires spent budget on each other", failed, sent)
	}
	busy := 0
	for _, fr := range results {
		if fr.Busy {
			busy++
		}
	}
	t.Logf("%d fire invocations, %d stepped aside as busy", len(results), busy)
}

// TestMalformedEventsWriteNothing: events/malformed.json (valid JSON, not
// a valid event), an empty payload and one that is not JSON get an
// InvalidEventError from every function (not the runtime's "EOF" or
// syntax error, which would name no function and no reason), and a
// malformed function URL request a 4xx; nothing reaches DynamoDB's write
// path or Scheduler.
func TestMalformedEventsWriteNothing(t *testing.T) {
	r := newRig(t)
	bad := readEvent(t, "malformed.json")
	for id := range functions {
		f := r.start(id, nil)
		for _, payload := range [][]byte{bad, nil, []byte("  "), []byte("source=orders"), []byte(`{"source":"orders"`)} {
			status, body := f.invoke(t, payload)
			var le lambdaError
			if err := json.Unmarshal(body, &le); err != nil || status != http.StatusOK {
				t.Fatalf("%s, payload %q: %d %s", id, payload, status, body)
			}
			if le.ErrorType != "InvalidEventError" || !strings.Contains(le.ErrorMessage, "invalid") {
				t.Errorf("%s, payload %q: error body %s, want an InvalidEventError", id, payload, body)
			}
		}
		if id == "ApiFunction" {
			var resp urlResponse
			f.invokeOK(t, withPath(t, "POST", "/v1/sources/orders/rows", "", `{"rows":[{"target":"t","puts":[{"key":"k","value":"not base64!"}]}]}`), &resp)
			if resp.StatusCode != 400 || !strings.Contains(resp.Body, "invalid_row") {
				t.Errorf("api with a malformed body: %d %s, want 400 invalid_row", resp.StatusCode, resp.Body)
			}
		}
	}
	if sent, _ := r.txCount(""); sent != 0 {
		t.Errorf("%d TransactWriteItems sent for malformed events", sent)
	}
	if st := r.sched.Stats(); st.Requests != 0 {
		t.Errorf("scheduler saw %+v for malformed events", st)
	}
}

// TestUnknownPlanRefusedAtStart: PLAN outside free|paid stops the function
// at init; the emulator reports the runtime's exit and the log says why.
func TestUnknownPlanRefusedAtStart(t *testing.T) {
	r := newRig(t)
	f := r.start("FireFunction", map[string]string{"PLAN": "gold"})
	status, body := f.invoke(t, readEvent(t, "fire.json"))
	if status == http.StatusOK && !strings.Contains(string(body), "errorMessage") {
		t.Fatalf("invocation with PLAN=gold succeeded: %d %s", status, body)
	}
	if !f.logContains(`PLAN="gold": unknown plan`) {
		t.Errorf("emulator output lacks the start-up error:\n%s", f.log.String())
	}
	if sent, _ := r.txCount(""); sent != 0 {
		t.Errorf("%d transactions sent by a function that refused to start", sent)
	}
}

// TestMisnamedTableRefusedAtStart: a TARGET_TABLE that names no table
// stops the function at init, the variable named in its log, before it
// takes a row it could not deliver (every apply would fail and every
// target be quarantined).
func TestMisnamedTableRefusedAtStart(t *testing.T) {
	r := newRig(t)
	f := r.start("FireFunction", map[string]string{"TARGET_TABLE": "relay-targte"})
	status, body := f.invoke(t, readEvent(t, "fire.json"))
	if status == http.StatusOK && !strings.Contains(string(body), "errorMessage") {
		t.Fatalf("invocation with a misnamed TARGET_TABLE succeeded: %d %s", status, body)
	}
	if !f.logContains(`TARGET_TABLE="relay-targte": no such table`) {
		t.Errorf("emulator output lacks the start-up error:\n%s", f.log.String())
	}
	if sent, _ := r.txCount(""); sent != 0 {
		t.Errorf("%d transactions sent by a function that refused to start", sent)
	}
	// In AWS the role's grants name the real tables, so the check's Query
	// of another is AccessDenied, which CheckTables reports the same way.
	r.forgetUnknownTables()
}
