package dynamo_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/relaycore"
)

// Refusals DynamoDB gives before running a request: certain, so one
// attempt, and neither "maybe applied" nor "precondition failed".
func TestRefusalsAreSurelyNotApplied(t *testing.T) {
	for _, f := range []fault{denied, invalid} {
		r := newFaultRig(t, 4)
		r.rt.then(f)
		err := r.store.Apply(t.Context(), "p", casBatch(0))
		if err == nil || relaycore.MayBeApplied(err) {
			t.Fatalf("fault %d: apply = %v, want a certain failure", f, err)
		}
		if _, ok := relaycore.FailedPrecondition(err); ok {
			t.Fatalf("fault %d: apply = %v is a condition failure", f, err)
		}
		if tokens, _ := r.rt.sent(); len(tokens) != 1 {
			t.Fatalf("fault %d: %d requests, want 1 (a refusal is not retried)", f, len(tokens))
		}
		wantCounter(t, r.store, 0)
	}
}

// The engine over a DynamoDB target: a certain refusal and an outcome that
// stays unknown but that rh shows did not land are both failed attempts
// (blocked, last error, one call); a lost response whose batch did land is a
// delivery, counted once.
func TestDeliveryClassifiesTargetFailures(t *testing.T) {
	cases := []struct {
		name        string
		faults      []fault
		ignoreToken bool
		delivered   bool
		message     string // in the target's last error
	}{
		{"access denied", []fault{denied}, false, false, "AccessDeniedException"},
		{"validation", []fault{invalid}, false, false, "ValidationException"},
		{"unknown, not applied", []fault{fail500, fail500}, false, false, "rh unchanged: not applied"},
		{"unknown, applied", []fault{drop}, true, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newFaultRig(t, 2)
			if c.ignoreToken {
				r.ep.IgnoreTokens()
			}
			// The source table goes around the faults.
			src := dynamo.New(r.ep.Client(http.DefaultTransport), rigTable, dynamo.Options{})
			clock := fixedClock(time.UnixMilli(1_800_000_000_000))
			if _, err := (&relaycore.RelayHandler{Source: src, Clock: clock}).Enqueue(t.Context(), "s", []relaycore.Row{{Target: "t", Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}}}, relaycore.EnqueueOptions{}); err != nil {
				t.Fatal(err)
			}
			h := &relaycore.RelayHandler{Source: src, Target: r.store, Clock: clock}
			r.rt.then(c.faults...)
			res, err := h.Fire(t.Context(), "s")
			if err != nil {
				t.Fatal(err)
			}
			st, err := relaycore.GetTarget(t.Context(), src, "s", "t")
			if err != nil {
				t.Fatal(err)
			}
			if res.TargetCalls != 1 {
				t.Fatalf("%d target calls, want 1", res.TargetCalls)
			}
			if c.delivered {
				if res.RowsDelivered != 1 || res.TargetsBlocked != 0 || st.LastError != nil || st.Pending != 0 {
					t.Fatalf("fire %+v, target %+v: want the row delivered once", res, st)
				}
				return
			}
			if res.RowsDelivered != 0 || res.TargetsBlocked != 1 || st.FailedAttempts != 1 || st.LastError == nil ||
				st.LastError.Class != relaycore.ErrorClassApply || !strings.Contains(st.LastError.Message, c.message) {
				t.Fatalf("fire %+v, target %+v (last error %+v): want a failed attempt naming %q", res, st, st.LastError, c.message)
			}
		})
	}
}

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }
