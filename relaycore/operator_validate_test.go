package relaycore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// TestActorValidate: the request rules hosts call before an action
// (Actor.Validate, SkipRequest.Validate) refuse what the engine refuses,
// each with ErrInvalidOperatorInput, and accept the rest.
func TestActorValidate(t *testing.T) {
	long := strings.Repeat("r", relaycore.MaxReasonLen+1)
	for _, tc := range []struct {
		name   string
		action relaycore.Action
		a      relaycore.Actor
		ok     bool
	}{
		{"plain", relaycore.ActionQuarantine, relaycore.Actor{By: "alice", Reason: "down"}, true},
		{"no reason", relaycore.ActionPause, relaycore.Actor{By: "alice"}, true},
		{"reason at the limit", relaycore.ActionRelease, relaycore.Actor{Reason: long[1:]}, true},
		{"skip needs a reason", relaycore.ActionSkip, relaycore.Actor{By: "alice"}, false},
		{"reason too long", relaycore.ActionResume, relaycore.Actor{Reason: long}, false},
		{"actor too long", relaycore.ActionResume, relaycore.Actor{By: strings.Repeat("a", relaycore.MaxActorLen+1)}, false},
		{"control character", relaycore.ActionQuarantine, relaycore.Actor{Reason: "a\x07b"}, false},
		{"DEL in the actor", relaycore.ActionQuarantine, relaycore.Actor{By: "a\x7f"}, false},
		{"not UTF-8", relaycore.ActionSkip, relaycore.Actor{Reason: "a\xffb"}, false},
		{"unknown action", relaycore.Action("shred"), relaycore.Actor{Reason: "x"}, false},
	} {
		err := tc.a.Validate(tc.action)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, relaycore.ErrInvalidOperatorInput)) {
			t.Errorf("%s: Validate(%s) = %v", tc.name, tc.action, err)
		}
	}
	for _, r := range []relaycore.SkipRequest{{ExpectFirst: 0, Through: 1}, {ExpectFirst: 3, Through: 2}, {ExpectFirst: 1, Through: 1}} {
		r.Reason = "why"
		if r.ExpectFirst == 1 {
			if err := r.Validate(); err != nil {
				t.Errorf("skip %d..%d: %v", r.ExpectFirst, r.Through, err)
			}
			r.Reason = ""
		}
		if err := r.Validate(); !errors.Is(err, relaycore.ErrInvalidOperatorInput) {
			t.Errorf("skip %d..%d reason %q: %v, want ErrInvalidOperatorInput", r.ExpectFirst, r.Through, r.Reason, err)
		}
	}
	if relaycore.Action("shred").AllowedIn(relaycore.StateActive) {
		t.Error("an unknown action is allowed")
	}
}
