package lambdainvoke_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/relay-dev/relay/infra/lambdainvoke"
	"github.com/relay-dev/relay/infra/lambdainvoke/invoketest"
)

const fireARN = "arn:aws:lambda:us-east-1:123456789012:function:relay-fire"

func newInvoker(t *testing.T) (*lambdainvoke.Invoker, *invoketest.Server) {
	t.Helper()
	srv := invoketest.Start(t, fireARN)
	v, err := lambdainvoke.New(lambdainvoke.Config{Client: srv.Client(), FunctionARN: fireARN})
	if err != nil {
		t.Fatal(err)
	}
	return v, srv
}

// TestContinueQueuesAsyncInvoke: one Continue is one signed async Invoke
// of the fire function with {"source","hop"}; the endpoint checks the
// wire shape (Event invocation type, function name, SigV4, payload).
func TestContinueQueuesAsyncInvoke(t *testing.T) {
	v, srv := newInvoker(t)
	if err := v.Continue(t.Context(), "tenant/42", 3); err != nil {
		t.Fatal(err)
	}
	inv := <-srv.C
	if inv.Source != "tenant/42" || inv.Hop != 3 || inv.FunctionName != fireARN {
		t.Errorf("invocation %+v", inv)
	}
	var in lambdainvoke.Input
	if err := json.Unmarshal(inv.Payload, &in); err != nil || in != (lambdainvoke.Input{Source: "tenant/42", Hop: 3}) {
		t.Errorf("payload %s (%v)", inv.Payload, err)
	}
	if st := v.Stats(); st != (lambdainvoke.Stats{Calls: 1, Accepted: 1}) {
		t.Errorf("stats %+v", st)
	}
}

func TestContinueRefusesBadArguments(t *testing.T) {
	v, srv := newInvoker(t)
	if err := v.Continue(t.Context(), "", 1); !errors.Is(err, lambdainvoke.ErrInvalidSource) {
		t.Errorf("empty source: %v", err)
	}
	if err := v.Continue(t.Context(), "orders", 0); err == nil {
		t.Error("hop 0 accepted: a continuation is at least hop 1")
	}
	if st := srv.Stats(); st.Requests != 0 {
		t.Errorf("refused calls reached Lambda: %+v", st)
	}
	if st := v.Stats(); st.Failures != 2 || st.Calls != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestContinueReportsLambdaErrors: throttling and service errors come back
// as errors naming the function (the caller logs them; the Scheduler kick
// covers the source) and are counted.
func TestContinueReportsLambdaErrors(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusInternalServerError} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			v, srv := newInvoker(t)
			srv.Fail(status)
			err := v.Continue(t.Context(), "orders", 1)
			if err == nil {
				t.Fatal("no error")
			}
			if st := v.Stats(); st.Failures != 1 || st.Accepted != 0 {
				t.Errorf("stats %+v", st)
			}
			if len(srv.Accepted()) != 0 {
				t.Error("a failed invoke was queued")
			}
		})
	}
}

func TestNewChecksConfig(t *testing.T) {
	srv := invoketest.Start(t, fireARN)
	for name, cfg := range map[string]lambdainvoke.Config{
		"no client": {FunctionARN: fireARN},
		"no arn":    {Client: srv.Client()},
	} {
		if _, err := lambdainvoke.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
