package emudeploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	lambdaenv "github.com/relay-dev/relay/lambda/env"
)

// memTransport delivers each request to the handler registered for its
// host, in the calling goroutine: the in-process deployment's network. A
// simulation on virtual time (testing/synctest) advances its clock only
// while every goroutine waits on a timer or a channel, never on a socket,
// so nothing in it may use one.
type memTransport map[string]http.Handler

func (m memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	h, ok := m[r.URL.Host]
	if !ok {
		return nil, fmt.Errorf("emudeploy: no endpoint at %s", r.URL.Host)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if r.Body != nil {
		_ = r.Body.Close()
	}
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// inProcEnv is an execution environment run in this process: the
// function's dependencies wired once by lambda/env from its environment
// variables, as its bootstrap's init does (env.Build, with this
// deployment's HTTP client in place of the SDK's default config), its
// handler the one the bootstrap serves (env.Deps' APIHandler,
// FireHandler, SweepHandler), called with the function's timeout as the
// context deadline, as the Lambda runtime does. Logs and metric lines go
// nowhere, but the metrics' reads are made, as in a real fire.
type inProcEnv struct {
	timeout time.Duration
	handle  func(ctx context.Context, payload []byte) (any, error)
}

func newInProcEnv(name string, env map[string]string, hc *http.Client, timeout time.Duration) (*inProcEnv, error) {
	getenv := func(k string) string { return env[k] }
	cfg, err := lambdaenv.Parse(getenv)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	awsCfg := aws.Config{Region: cfg.Region, HTTPClient: hc,
		Credentials: credentials.NewStaticCredentialsProvider(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], "")}
	d, err := lambdaenv.Build(cfg, awsCfg, io.Discard)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	e := &inProcEnv{timeout: timeout}
	switch name {
	case "api":
		h, err := d.APIHandler(getenv)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		e.handle = func(ctx context.Context, p []byte) (any, error) { return h.Handle(ctx, p) }
	case "fire":
		h := d.FireHandler()
		e.handle = func(ctx context.Context, p []byte) (any, error) { return h.Handle(ctx, p) }
	case "sweep":
		h := d.SweepHandler()
		e.handle = func(ctx context.Context, p []byte) (any, error) { return h.Handle(ctx, p) }
	default:
		return nil, fmt.Errorf("no function %q", name)
	}
	return e, nil
}

// Invoke runs the handler and answers its result as the runtime does: the
// result as JSON, or a function error.
func (e *inProcEnv) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	res, err := e.handle(ctx, payload)
	if err != nil {
		return json.Marshal(map[string]string{"errorMessage": err.Error(), "errorType": fmt.Sprintf("%T", err)})
	}
	return json.Marshal(res)
}
