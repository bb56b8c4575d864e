package lambdainvoke_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/lambdainvoke"
	"github.com/relay-dev/relay/infra/lambdainvoke/invoketest"
	"github.com/relay-dev/relay/relaycore"
)

// recordKicker is the fallback (Scheduler's place): it records its kicks
// and fails when err is set.
type recordKicker struct {
	mu    sync.Mutex
	kicks []int64
	err   error
}

func (r *recordKicker) Kick(_ context.Context, _ relaycore.Partition, dueMS int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kicks = append(r.kicks, dueMS)
	return r.err
}

func newKicker(t *testing.T, now time.Time) (*lambdainvoke.Kicker, *invoketest.Server, *recordKicker) {
	t.Helper()
	srv := invoketest.Start(t, fireARN)
	fb := &recordKicker{}
	k, err := lambdainvoke.NewKicker(lambdainvoke.KickerConfig{Client: srv.Client(), FunctionARN: fireARN, Fallback: fb, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return k, srv, fb
}

// TestKickDueNowInvokes: a kick due now is one signed async Invoke of the
// fire function with the schedule's event {"source"} (hop 0), and nothing
// for the fallback; a second kick for the same due collapses, one for a
// new due is sent.
func TestKickDueNowInvokes(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	k, srv, fb := newKicker(t, now)
	for range 2 {
		if err := k.Kick(t.Context(), "tenant/42", now.UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.Kick(t.Context(), "tenant/42", now.UnixMilli()-1); err != nil {
		t.Fatal(err)
	}
	acc := srv.Accepted()
	if len(acc) != 2 {
		t.Fatalf("%d invokes, want 2 (the repeated due collapses)", len(acc))
	}
	inv := acc[0]
	if inv.Source != "tenant/42" || inv.Hop != 0 || inv.FunctionName != fireARN {
		t.Errorf("invocation %+v", inv)
	}
	var in map[string]any
	if err := json.Unmarshal(inv.Payload, &in); err != nil || len(in) != 1 || in["source"] != "tenant/42" {
		t.Errorf("payload %s (%v), want exactly {\"source\":...}", inv.Payload, err)
	}
	if len(fb.kicks) != 0 {
		t.Errorf("fallback kicked %v", fb.kicks)
	}
	if st := k.Stats(); st != (lambdainvoke.KickerStats{Fast: 2, Collapsed: 1}) {
		t.Errorf("stats %+v", st)
	}
}

// TestKickDueLaterGoesToFallback: a kick due in the future (a back-off
// re-arm, a held row's retry) is the fallback's; no invoke, which would
// fire before anything is due.
func TestKickDueLaterGoesToFallback(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	k, srv, fb := newKicker(t, now)
	due := now.Add(10 * time.Second).UnixMilli()
	if err := k.Kick(t.Context(), "orders", due); err != nil {
		t.Fatal(err)
	}
	if st := srv.Stats(); st.Requests != 0 {
		t.Errorf("invoked for a later due: %+v", st)
	}
	if len(fb.kicks) != 1 || fb.kicks[0] != due {
		t.Errorf("fallback kicks %v, want [%d]", fb.kicks, due)
	}
	if st := k.Stats(); st != (lambdainvoke.KickerStats{Later: 1}) {
		t.Errorf("stats %+v", st)
	}
}

// TestKickRefusedFallsBack: an invoke Lambda refuses (throttled, failing)
// goes to the fallback with the same due and returns its answer; it is not
// remembered as started, so the next kick for the due tries Lambda again.
// When the fallback fails too, the error tells both.
func TestKickRefusedFallsBack(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusInternalServerError} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			now := time.UnixMilli(1_700_000_000_000)
			k, srv, fb := newKicker(t, now)
			srv.Fail(status)
			if err := k.Kick(t.Context(), "orders", now.UnixMilli()); err != nil {
				t.Fatalf("fallback armed, yet: %v", err)
			}
			if len(fb.kicks) != 1 || fb.kicks[0] != now.UnixMilli() {
				t.Fatalf("fallback kicks %v", fb.kicks)
			}
			fb.err = errors.New("scheduler down")
			err := k.Kick(t.Context(), "orders", now.UnixMilli())
			if err == nil || !errors.Is(err, fb.err) {
				t.Fatalf("both failed, got %v", err)
			}
			srv.Fail(0)
			fb.err = nil
			if err := k.Kick(t.Context(), "orders", now.UnixMilli()); err != nil {
				t.Fatal(err)
			}
			if len(srv.Accepted()) != 1 || len(fb.kicks) != 2 {
				t.Errorf("%d invokes, fallback %v", len(srv.Accepted()), fb.kicks)
			}
			if st := k.Stats(); st != (lambdainvoke.KickerStats{Fast: 1, Refused: 2, FallbackFailures: 1}) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestNewKickerChecksConfig(t *testing.T) {
	srv := invoketest.Start(t, fireARN)
	fb := &recordKicker{}
	for _, cfg := range []lambdainvoke.KickerConfig{
		{FunctionARN: fireARN, Fallback: fb},
		{Client: srv.Client(), Fallback: fb},
		{Client: srv.Client(), FunctionARN: fireARN},
	} {
		if _, err := lambdainvoke.NewKicker(cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	k, err := lambdainvoke.NewKicker(lambdainvoke.KickerConfig{Client: srv.Client(), FunctionARN: fireARN, Fallback: fb})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Kick(t.Context(), "", 1); !errors.Is(err, lambdainvoke.ErrInvalidSource) {
		t.Errorf("empty source: %v", err)
	}
}
