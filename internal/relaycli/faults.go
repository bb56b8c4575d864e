package relaycli

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// faultTransport injects DynamoDB's two everyday failures into a share of
// the data-plane requests (GetItem, Query, Scan, TransactWriteItems) the
// demo sends, around the real transport: a throttled request is answered
// with a ThrottlingException and never reaches the endpoint; a dropped
// response reaches the endpoint, runs there, and its answer is lost as a
// connection reset would lose it. Table management (CreateTable,
// DescribeTable) is left alone so setup is not what gets tested.
//
// Draws come from one seeded generator, so a run's fault rate is
// reproducible, though which request gets which fault depends on the order
// concurrent requests arrive in.
type faultTransport struct {
	next           http.RoundTripper
	throttle, drop float64 // shares of data-plane requests, throttle+drop <= 1

	mu  sync.Mutex
	rng *rand.Rand

	throttled, dropped atomic.Int64
}

func newFaultTransport(next http.RoundTripper, throttle, drop float64, seed uint64) (*faultTransport, error) {
	if throttle < 0 || drop < 0 || throttle+drop > 1 {
		return nil, fmt.Errorf("fault shares must be >= 0 and add up to at most 1 (throttle %g, drop %g)", throttle, drop)
	}
	return &faultTransport{next: next, throttle: throttle, drop: drop, rng: rand.New(rand.NewPCG(seed, 0xfa017))}, nil
}

// faultedOps are the requests faults are injected into.
var faultedOps = map[string]bool{"GetItem": true, "Query": true, "Scan": true, "TransactWriteItems": true}

func (f *faultTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	op := r.Header.Get("X-Amz-Target")
	if !faultedOps[op[strings.LastIndexByte(op, '.')+1:]] {
		return f.next.RoundTrip(r)
	}
	f.mu.Lock()
	u := f.rng.Float64()
	f.mu.Unlock()
	switch {
	case u < f.throttle:
		f.throttled.Add(1)
		if r.Body != nil {
			_ = r.Body.Close()
		}
		const body = `{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput (injected by the demo)."}`
		return &http.Response{
			StatusCode: http.StatusBadRequest, Status: "400 Bad Request", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
			Body:          io.NopCloser(strings.NewReader(body)),
			ContentLength: int64(len(body)), Request: r,
		}, nil
	case u < f.throttle+f.drop:
		f.dropped.Add(1)
		resp, err := f.next.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errDroppedResponse
	}
	return f.next.RoundTrip(r)
}

var errDroppedResponse = errors.New("read tcp: connection reset by peer (response dropped by the demo after the endpoint ran the request)")
