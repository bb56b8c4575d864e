//go:build unix

package rietest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/lambdainvoke/invoketest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/fire"
	"github.com/relay-dev/relay/relaycore"
)

// fastKick takes the one async invoke the api function sent for a fast
// kick: the schedule's event {"source":"orders"}, hop 0.
func (r *rig) fastKick(lam *invoketest.Server) invoketest.Invocation {
	r.t.Helper()
	select {
	case inv := <-lam.C:
		if inv.Source != "orders" || inv.Hop != 0 || string(inv.Payload) != `{"source":"orders"}` {
			r.t.Fatalf("fast kick %+v (payload %s), want {\"source\":\"orders\"}", inv, inv.Payload)
		}
		return inv
	default:
		// The invoke is made before the api answers: none now is none.
		r.t.Fatalf("no fast kick reached the Lambda endpoint (stats %+v)", lam.Stats())
		return invoketest.Invocation{}
	}
}

// kickLogged reports whether the api function logged an enqueue whose kick
// decision was d.
func kickLogged(t *testing.T, apiFn *function, d relaycore.KickDecision) int {
	t.Helper()
	return strings.Count(apiFn.settled(t), fmt.Sprintf(`"kick":%q`, d.String()))
}

// setAlarm rewrites source's durable alarm to dueMS (as a fire's re-arm
// would), so a test can make a wake-up overdue without waiting.
func (r *rig) setAlarm(source relaycore.Partition, dueMS int64) {
	r.t.Helper()
	w := relaycore.Write{Key: relaycore.KeyAlarm, Value: fmt.Appendf(nil, `{"due_ms":%d}`, dueMS), Due: dueMS}
	if err := r.source.Apply(r.t.Context(), source, relaycore.Batch{Writes: []relaycore.Write{w}}); err != nil {
		r.t.Fatal(err)
	}
}

// holdClaim writes a live fire claim on source's rs, as a fire running in
// another execution environment holds it, until untilMS.
func (r *rig) holdClaim(source relaycore.Partition, untilMS int64) {
	r.t.Helper()
	rs := fmt.Appendf(nil, `{"ver":1,"cycle_end":0,"cursor":0,"claim":{"owner":"other-environment","until_ms":%d}}`, untilMS)
	if err := r.source.Apply(r.t.Context(), source, relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyRS, Value: rs}}}); err != nil {
		r.t.Fatal(err)
	}
}

// TestFastKickStartsFire: with the template's default (FAST_KICK=true) the
// api function's enqueue starts the fire through the async Invoke
// endpoint, {"source":"orders"} to the fire function and no schedule; the
// fire that event runs delivers the rows and clears the alarm. A second
// enqueue while that wake-up is on its way sends nothing (kick
// "pending"); one into the drained source kicks again. Its invokes are
// within its IAM grant (checkGrants), and the grant is what it used.
func TestFastKickStartsFire(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	fireFn := r.start("FireFunction", nil)
	lam := r.lam["ApiFunction"]

	var enq, enq2 api.EnqueueResponse
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq)
	inv := r.fastKick(lam)
	if p := r.sched.Pending(); len(p) != 0 {
		t.Fatalf("the fast kick also armed schedules %+v", p)
	}
	// The same rows again, before the fire ran: the alarm is due and its
	// kick was just sent.
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq2)
	if st := lam.Stats(); st.Requests != 1 || len(r.sched.Pending()) != 0 {
		t.Fatalf("second enqueue into a source already kicked: lambda %+v, schedules %+v", st, r.sched.Pending())
	}
	if n := kickLogged(t, apiFn, relaycore.KickPending); n != 1 {
		t.Errorf("%d enqueues logged kick pending, want 1", n)
	}

	var fr fire.Result
	fireFn.invokeOK(t, inv.Payload, &fr)
	if fr.RowsDelivered != 4 || !fr.Cleared || fr.Busy || fr.Hop != 0 {
		t.Fatalf("fire result %+v, want 4 rows delivered and the alarm cleared", fr)
	}
	r.checkDelivered("orders", sampleRows(t), enq2.Seqs)
	if st := r.lam["FireFunction"].Stats(); st.Requests != 0 {
		t.Errorf("the fire function invoked itself %+v after draining", st)
	}

	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq)
	r.fastKick(lam)
	if n := kickLogged(t, apiFn, relaycore.KickSent); n != 2 {
		t.Errorf("%d enqueues logged kick sent, want 2", n)
	}
	checkInvokeGrant(t, "ApiFunction")
}

// checkInvokeGrant: fn's only Lambda grant is lambda:InvokeFunction on the
// fire function (nothing more than the fast kick uses).
func checkInvokeGrant(t *testing.T, fn string) {
	t.Helper()
	granted, err := templateGrants()
	if err != nil {
		t.Fatal(err)
	}
	var lambdaGrants []grant
	for g := range granted {
		if g.fn == fn && strings.HasPrefix(g.action, "lambda:") {
			lambdaGrants = append(lambdaGrants, g)
		}
	}
	if want := (grant{fn, "lambda:InvokeFunction", templateFireARN}); len(lambdaGrants) != 1 || lambdaGrants[0] != want {
		t.Errorf("%s Lambda grants %v, want exactly %v", fn, lambdaGrants, want)
	}
}

// TestFastKickRefusedFallsBack: Lambda refuses the fast kick's invoke
// (throttled); the api function kicks through Scheduler instead, with the
// same due time, and the schedule's fire delivers the row.
func TestFastKickRefusedFallsBack(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	fireFn := r.start("FireFunction", nil)
	lam := r.lam["ApiFunction"]

	lam.Fail(http.StatusTooManyRequests)
	var enq api.EnqueueResponse
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, &enq)
	if st := lam.Stats(); st.Requests == 0 || st.Accepted != 0 {
		t.Fatalf("lambda %+v: the fast kick was not tried, or was queued", st)
	}
	if !apiFn.logContains("relay fast kick refused") {
		t.Error("the refused fast kick was not logged")
	}
	scheds := r.sched.TakeAll()
	if len(scheds) != 1 || scheds[0].Input != `{"source":"orders"}` {
		t.Fatalf("schedules after the refused invoke: %+v, want one fallback kick", scheds)
	}
	var fr fire.Result
	fireFn.invokeOK(t, []byte(scheds[0].Input), &fr)
	if fr.RowsDelivered != 2 || !fr.Cleared {
		t.Fatalf("fire result %+v, want the rows delivered", fr)
	}
	r.checkDelivered("orders", sampleRows(t), enq.Seqs)
}

// TestDuplicateFastKickBusy: a fast kick's event delivered while another
// invocation's fire holds the source's claim (Lambda's at-least-once
// delivery, or two kicks) answers busy and calls no target; it asks
// Scheduler to look again when the claim lapses, and does not invoke
// itself.
func TestDuplicateFastKickBusy(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	fireFn := r.start("FireFunction", nil)

	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, nil)
	inv := r.fastKick(r.lam["ApiFunction"])
	until := time.Now().Add(time.Minute).UnixMilli()
	r.holdClaim("orders", until)
	targetTx, _ := r.txCount(targetTable)

	var fr fire.Result
	fireFn.invokeOK(t, inv.Payload, &fr)
	if !fr.Busy || fr.TargetCalls != 0 || fr.RowsDelivered != 0 || fr.Continued {
		t.Fatalf("duplicate fire %+v, want busy with no target call", fr)
	}
	if n, _ := r.txCount(targetTable); n != targetTx {
		t.Errorf("%d target transactions by a busy fire", n-targetTx)
	}
	scheds := r.sched.Pending()
	if len(scheds) != 1 || !strings.Contains(scheds[0].Name, fmt.Sprint((until+999)/1000)) {
		t.Errorf("schedules %+v, want one at the claim's lapse (%d)", scheds, until)
	}
	if st := r.lam["FireFunction"].Stats(); st.Requests != 0 {
		t.Errorf("a busy fire invoked the fire function: %+v", st)
	}
}

// TestEnqueueIntoClaimedSourceSendsNoInvoke: an enqueue into a source
// whose alarm is overdue while a fire holds the claim sends no invoke and
// arms no schedule (kick "claimed": that fire re-arms when it ends); once
// the claim is gone, the same overdue alarm is kicked fast again (its
// wake-up is late or lost).
func TestEnqueueIntoClaimedSourceSendsNoInvoke(t *testing.T) {
	r := newRig(t)
	apiFn := r.start("ApiFunction", nil)
	lam := r.lam["ApiFunction"]

	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, nil)
	r.fastKick(lam)
	// A fire started by that kick has been running for a minute.
	now := time.Now()
	r.setAlarm("orders", now.Add(-time.Minute).UnixMilli())
	r.holdClaim("orders", now.Add(time.Minute).UnixMilli())

	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, nil)
	if st := lam.Stats(); st.Requests != 1 {
		t.Fatalf("lambda %+v: an enqueue into a claimed source invoked the fire function", st)
	}
	if p := r.sched.Pending(); len(p) != 0 {
		t.Fatalf("schedules %+v for a claimed source", p)
	}
	if n := kickLogged(t, apiFn, relaycore.KickClaimed); n != 1 {
		t.Errorf("%d enqueues logged kick claimed, want 1", n)
	}

	r.holdClaim("orders", now.UnixMilli()) // the fire was cut off: its claim lapsed
	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, nil)
	r.fastKick(lam)
}

// TestOpsFunctionKicksThroughScheduler: the ops function gains no invoke
// grant, and needs none: with FAST_KICK set in its environment it still
// kicks through Scheduler (a resume makes the alarm due and kicks).
func TestOpsFunctionKicksThroughScheduler(t *testing.T) {
	r := newRig(t)
	opsFn := r.start("OpsFunction", map[string]string{"FAST_KICK": "true"})
	apiFn := r.start("ApiFunction", map[string]string{"FAST_KICK": "false"})

	apiCall(t, apiFn, readEvent(t, "api-enqueue.json"), 200, nil)
	r.sched.TakeAll()
	tgt := sampleRows(t)[0].Target
	apiCall(t, opsFn, withPath(t, "POST", "/v1/sources/orders/targets/"+tgt+"/pause", "", `{"reason":"maintenance"}`), 200, nil)
	apiCall(t, opsFn, withPath(t, "POST", "/v1/sources/orders/targets/"+tgt+"/resume", "", `{"reason":"done"}`), 200, nil)
	if len(r.sched.Pending()) == 0 {
		t.Error("resume armed no schedule")
	}
	if st := r.lam["OpsFunction"].Stats(); st.Requests != 0 {
		t.Errorf("the ops function invoked the fire function: %+v", st)
	}
	granted, err := templateGrants()
	if err != nil {
		t.Fatal(err)
	}
	for g := range granted {
		if (g.fn == "OpsFunction" || g.fn == "SweepFunction") && strings.HasPrefix(g.action, "lambda:") {
			t.Errorf("template grants %v", g)
		}
	}
}
