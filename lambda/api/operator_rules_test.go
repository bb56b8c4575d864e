package api_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// TestActionStateRules: every operator action in every target state,
// through the API and through the engine on a rig in the same state. The
// API answers 200 exactly where the engine's action succeeds and
// Action.AllowedIn says it may, and both agree with the documented rules
// (docs/api.md: quarantine from active and paused, release from
// quarantined, pause from active, resume from paused, skip from
// quarantined and paused); elsewhere the API answers 409 wrong_state and
// writes nothing, and the engine refuses with a *TargetStateError. So the
// API has no rule of its own that could drift from the engine's.
func TestActionStateRules(t *testing.T) {
	documented := map[relaycore.Action][]relaycore.TargetState{
		relaycore.ActionQuarantine: {relaycore.StateActive, relaycore.StatePaused},
		relaycore.ActionRelease:    {relaycore.StateQuarantined},
		relaycore.ActionPause:      {relaycore.StateActive},
		relaycore.ActionResume:     {relaycore.StatePaused},
		relaycore.ActionSkip:       {relaycore.StateQuarantined, relaycore.StatePaused},
	}
	states := []relaycore.TargetState{relaycore.StateActive, relaycore.StateQuarantined, relaycore.StatePaused}
	// inState is a rig whose target t1 is in state s, with rows 2..3
	// held unless it is active (row 1 was delivered before).
	inState := func(t *testing.T, s relaycore.TargetState) *opRig {
		t.Helper()
		r := newOpRig(t, api.RoutesOperator)
		r.enqueue(t, put("t1", "k", "v1"))
		r.alarm(t)
		r.enqueue(t, put("t1", "k", "v2"), put("t1", "k", "v3"))
		a := relaycore.Actor{By: "test"}
		var err error
		switch s {
		case relaycore.StateQuarantined:
			_, err = r.h.Relay.Quarantine(t.Context(), "orders", "t1", a)
		case relaycore.StatePaused:
			_, err = r.h.Relay.Pause(t.Context(), "orders", "t1", a)
		}
		if err != nil {
			t.Fatal(err)
		}
		r.alarm(t)
		var tr api.TargetResponse
		r.do(t, "GET", "/v1/sources/orders/targets/t1", "", "", 200, &tr)
		if tr.Status.State != s || (s != relaycore.StateActive) != (tr.Status.HeldFirst == 2) {
			t.Fatalf("set up %s: status %+v", s, tr.Status)
		}
		return r
	}
	engine := func(t *testing.T, r *opRig, action relaycore.Action) (relaycore.TargetState, error) {
		a := relaycore.Actor{By: "test", Reason: "why"}
		var st relaycore.TargetStatus
		var err error
		switch h, ctx := r.h.Relay, t.Context(); action {
		case relaycore.ActionQuarantine:
			st, err = h.Quarantine(ctx, "orders", "t1", a)
		case relaycore.ActionRelease:
			st, err = h.Release(ctx, "orders", "t1", a)
		case relaycore.ActionPause:
			st, err = h.Pause(ctx, "orders", "t1", a)
		case relaycore.ActionResume:
			st, err = h.Resume(ctx, "orders", "t1", a)
		case relaycore.ActionSkip:
			var res relaycore.SkipResult
			res, err = h.Skip(ctx, "orders", relaycore.SkipRequest{Target: "t1", ExpectFirst: 2, Through: 2, Actor: a})
			st = res.Status
		default:
			t.Fatalf("action %q has no engine call here", action)
		}
		return st.State, err
	}
	for action, from := range documented {
		body := `{"reason":"why"}`
		if action == relaycore.ActionSkip {
			body = `{"expect_first":2,"through":2,"reason":"why"}`
		}
		for _, s := range states {
			t.Run(fmt.Sprintf("%s from %s", action, s), func(t *testing.T) {
				allowed := false
				for _, f := range from {
					allowed = allowed || f == s
				}
				if action.AllowedIn(s) != allowed {
					t.Fatalf("AllowedIn(%s) = %v, documented %v", s, !allowed, allowed)
				}
				want, wantErr := engine(t, inState(t, s), action)
				var stErr *relaycore.TargetStateError
				if allowed && wantErr != nil {
					t.Fatalf("engine refused an allowed action: %v", wantErr)
				}
				if !allowed && (!errors.As(wantErr, &stErr) || stErr.State != s || stErr.Action != action || !errors.Is(wantErr, relaycore.ErrWrongState)) {
					t.Fatalf("engine: %v, want a TargetStateError (%s in %s)", wantErr, action, s)
				}

				r := inState(t, s)
				src, dst := r.src.Dump(), r.dst.Dump()
				path := "/v1/sources/orders/targets/t1/" + string(action)
				if allowed {
					var got relaycore.TargetStatus
					if action == relaycore.ActionSkip {
						var res api.SkipResponse
						r.do(t, "POST", path, "", body, 200, &res)
						got = res.Status
					} else {
						var res api.TargetResponse
						r.do(t, "POST", path, "", body, 200, &res)
						got = res.Status
					}
					if got.State != want {
						t.Errorf("API left the target %s, the engine %s", got.State, want)
					}
					return
				}
				var eb api.ErrorBody
				r.do(t, "POST", path, "", body, 409, &eb)
				if eb.Error.Code != "wrong_state" || eb.Error.Message != stErr.Error() {
					t.Errorf("API answered %+v, want wrong_state with the engine's %q", eb.Error, stErr.Error())
				}
				if !reflect.DeepEqual(r.src.Dump(), src) || !reflect.DeepEqual(r.dst.Dump(), dst) {
					t.Error("a refused action changed the stores")
				}
			})
		}
	}
}
