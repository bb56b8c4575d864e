package emudeploy

import (
	"net/http"
	"sync"
	"time"

	"github.com/relay-dev/relay/internal/awsproto"
)

// InvokeStats counts one Invoke endpoint's requests.
type InvokeStats struct {
	// Requests received; Accepted answered 202 and queued; Refused
	// answered with the refusal status; Invalid broke the contract.
	Requests, Accepted, Refused, Invalid int
}

// Invoke is the Lambda Invoke endpoint one function's code calls (each
// function gets its own, so the counts say who invoked): POST
// /2015-03-31/functions/{FunctionName}/invocations with
// X-Amz-Invocation-Type Event, for the one function it may invoke. It
// answers 202 and queues the event on that function, or, while refusing,
// answers the refusal status (a throttled or denied invoke) and queues
// nothing. Other requests (another function, a synchronous invoke, a
// qualifier, unsigned, an event without a source) are answered 400 and
// counted as Invalid.
type Invoke struct {
	arn     string
	latency time.Duration
	target  func(payload []byte)

	mu      sync.Mutex
	refuse  int
	stats   InvokeStats
	invalid []string
}

// NewInvoke returns an endpoint that hands accepted async invokes of arn
// to target (a Function's Queue); latency holds each response (the API
// request's round trip).
func NewInvoke(arn string, latency time.Duration, target func(payload []byte)) *Invoke {
	return &Invoke{arn: arn, latency: latency, target: target}
}

// Refuse makes every following request fail with status (429
// TooManyRequestsException, 403 AccessDeniedException, 5xx
// ServiceException); 0 accepts again.
func (v *Invoke) Refuse(status int) {
	v.mu.Lock()
	v.refuse = status
	v.mu.Unlock()
}

// Stats returns the counters.
func (v *Invoke) Stats() InvokeStats {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.stats
}

// Violations lists the invalid requests seen, each with its reason.
func (v *Invoke) Violations() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.invalid...)
}

// ServeHTTP answers one Invoke request.
func (v *Invoke) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if v.latency > 0 {
		time.Sleep(v.latency) // the request's round trip, not synchronisation
	}
	payload, problem := v.parse(r)
	v.mu.Lock()
	v.stats.Requests++
	refuse := v.refuse
	switch {
	case problem != "":
		v.stats.Invalid++
		v.invalid = append(v.invalid, problem)
		v.mu.Unlock()
		awsproto.WriteError(w, http.StatusBadRequest, "InvalidRequestContentException", map[string]string{"Type": "User", "message": problem})
		return
	case refuse != 0:
		v.stats.Refused++
		v.mu.Unlock()
		typ := "ServiceException"
		switch refuse {
		case http.StatusTooManyRequests:
			typ = "TooManyRequestsException"
		case http.StatusForbidden:
			typ = "AccessDeniedException"
		}
		awsproto.WriteError(w, refuse, typ, map[string]string{"Type": "User", "message": "refused by the emulated deployment"})
		return
	}
	v.stats.Accepted++
	v.mu.Unlock()
	v.target(payload)
	w.WriteHeader(http.StatusAccepted)
}

func (v *Invoke) parse(r *http.Request) ([]byte, string) {
	data, _, problem := awsproto.ParseInvoke(r, v.arn)
	return data, problem
}
