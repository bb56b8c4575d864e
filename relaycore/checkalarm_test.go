package relaycore_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
)

// CheckAlarm says what a sweeper needs before firing a source it was not
// kicked for: nothing armed, armed but not yet due, due, or held by a live
// claim of a fire (retry when it lapses) or of an operator action (retry
// within a second).
func TestCheckAlarm(t *testing.T) {
	ctx := t.Context()
	st := mem.New(relaycore.Capabilities{})
	t0 := time.UnixMilli(1_800_000_000_000)
	check := func(now time.Time) relaycore.AlarmCheck {
		t.Helper()
		chk, err := relaycore.CheckAlarm(ctx, st, "s", now)
		if err != nil {
			t.Fatal(err)
		}
		return chk
	}
	if chk := check(t0); chk != (relaycore.AlarmCheck{}) || chk.Fire(t0.UnixMilli()) {
		t.Fatalf("no alarm: %+v", chk)
	}
	h := &relaycore.RelayHandler{Source: st, Clock: fixed{t0}}
	if _, err := h.Enqueue(ctx, "s", []relaycore.Row{{Target: "t", Puts: []relaycore.KV{{Key: "k", Value: []byte("v")}}}}, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if chk := check(t0); chk.DueMS != t0.UnixMilli() || chk.Claim != nil || !chk.Fire(t0.UnixMilli()) {
		t.Fatalf("armed and due: %+v", chk)
	}
	if chk := check(t0.Add(-time.Millisecond)); chk.Fire(t0.UnixMilli() - 1) {
		t.Fatalf("not yet due, but Fire: %+v", chk)
	}
	for _, tc := range []struct {
		owner    string
		until    time.Time
		live     bool
		retry    time.Time
		operator bool
	}{
		{"fire-token", t0.Add(10 * time.Second), true, t0.Add(10 * time.Second), false},
		{"op-token", t0.Add(10 * time.Second), true, t0.Add(time.Second), true},
		{"fire-token", t0, false, time.Time{}, false}, // lapses at t0: not live
	} {
		raw, err := json.Marshal(relaycore.RelayState{Version: 1, Claim: &relaycore.Claim{Owner: tc.owner, UntilMS: tc.until.UnixMilli()}})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Apply(ctx, "s", relaycore.Batch{Writes: []relaycore.Write{{Key: relaycore.KeyRS, Value: raw}}}); err != nil {
			t.Fatal(err)
		}
		chk := check(t0)
		if (chk.Claim != nil) != tc.live || chk.Fire(t0.UnixMilli()) == tc.live || chk.Operator != tc.operator {
			t.Fatalf("claim %s until %v: %+v", tc.owner, tc.until, chk)
		}
		if tc.live && chk.RetryMS != tc.retry.UnixMilli() {
			t.Fatalf("claim %s: retry at %d, want %d", tc.owner, chk.RetryMS, tc.retry.UnixMilli())
		}
	}
}

type fixed struct{ t time.Time }

func (f fixed) Now() time.Time { return f.t }
