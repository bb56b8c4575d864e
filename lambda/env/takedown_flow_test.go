package env

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/scheduler/schedulertest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// The takedown flow on the Lambda path: the handlers the functions' mains
// serve (APIHandler for the producer and operator URLs, FireHandler,
// SweepHandler), wired by Build from the variables template.yaml sets,
// through the real SDK against the DynamoDB-API and Scheduler endpoints.
// Nodes are IAM roles mapped by HOLD_NODES; an unmapped caller and another
// node's receipt are refused; the fire function's owner pass orders the
// holders, and the sweep's pass reports the EMF metrics.
func TestTakedownFlowOnLambda(t *testing.T) {
	ctx := t.Context()
	ddb := dynamotest.Start(t)
	for _, tbl := range []string{"relay-source", "relay-target"} {
		if err := dynamo.CreateTable(ctx, ddb.Client(nil), tbl); err != nil {
			t.Fatal(err)
		}
	}
	sched := schedulertest.Start(t)
	dir := pkitest.New(t, "edge-a", "edge-b")
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	vars := valid()
	vars[VarDynamoDBEndpoint], vars[VarSchedulerEndpoint] = ddb.URL, sched.URL
	vars[VarContinuationHops], vars[VarFastKick] = "0", "false"
	vars[VarTakedownCA] = string(ca)
	vars[VarHoldNodes] = "arn:aws:iam::123456789012:role/edge-a=edge-a,arn:aws:iam::123456789012:role/edge-b=edge-b"
	cfg, err := Parse(getenv(vars))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	d, err := Build(cfg, aws.Config{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("relay", "relay", "")}, &logs)
	if err != nil {
		t.Fatal(err)
	}
	producer, err := d.APIHandler(getenv(map[string]string{VarRoutes: "producer"}))
	if err != nil {
		t.Fatal(err)
	}
	operator, err := d.APIHandler(getenv(map[string]string{VarRoutes: "operator"}))
	if err != nil {
		t.Fatal(err)
	}
	call := func(h *api.Handler, caller, method, path, query string, body []byte, hdr ...string) events.LambdaFunctionURLResponse {
		t.Helper()
		ev := events.LambdaFunctionURLRequest{Version: "2.0", RawPath: path, RawQueryString: query, Body: string(body),
			Headers: map[string]string{"content-type": "application/json"}}
		for i := 0; i+1 < len(hdr); i += 2 {
			ev.Headers[hdr[i]] = hdr[i+1]
		}
		ev.RequestContext.HTTP.Method = method
		ev.RequestContext.Authorizer = &events.LambdaFunctionURLRequestContextAuthorizerDescription{
			IAM: &events.LambdaFunctionURLRequestContextAuthorizerIAMDescription{UserARN: caller}}
		raw, _ := json.Marshal(ev)
		resp, err := h.Handle(ctx, raw)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	node := func(n string) string { return "arn:aws:sts::123456789012:assumed-role/" + n + "/device-1" }
	ops := "arn:aws:sts::123456789012:assumed-role/relay-operator/alice"
	fire := func(src string) {
		t.Helper()
		if _, err := d.FireHandler().Handle(ctx, json.RawMessage(`{"source":"`+src+`"}`)); err != nil {
			t.Fatalf("fire %s: %v", src, err)
		}
	}
	digest := strings.Repeat("7a", 32)
	for _, n := range []string{"edge-a", "edge-b"} {
		body := []byte(`{"reports":[{"content_id":"seg-9f2c","sha256":"` + digest + `","size":5,"state":"held","observed_ms":` +
			itoa(time.Now().UnixMilli()) + `}]}`)
		if r := call(producer, node(n), "POST", "/v1/holdings", "", body, "idempotency-key", "boot/1"); r.StatusCode != 200 {
			t.Fatalf("report %s: %d %s", n, r.StatusCode, r.Body)
		}
		fire(string(takedowns.HoldingsSource(n)))
	}
	if r := call(producer, node("edge-z"), "GET", "/v1/orders", "", nil); r.StatusCode != 403 {
		t.Fatalf("an unmapped caller's orders: %d %s", r.StatusCode, r.Body)
	}
	if r := call(producer, node("edge-a"), "POST", "/v1/takedowns", "", []byte(`{"content_id":"seg-9f2c","reason":"r"}`)); r.StatusCode != 404 {
		t.Fatalf("a takedown on the producer URL: %d %s", r.StatusCode, r.Body)
	}
	r := call(operator, ops, "POST", "/v1/takedowns", "", []byte(`{"content_id":"seg-9f2c","reason":"dmca 2026-118"}`))
	var td api.TakedownResponse
	if json.Unmarshal([]byte(r.Body), &td); r.StatusCode != 200 || len(td.Holders) != 2 || td.RequestedBy != "123456789012:assumed-role/relay-operator/alice" {
		t.Fatalf("request: %d %s", r.StatusCode, r.Body)
	}
	fire(string(takedowns.ControlSource)) // the requests; the owner's pass orders
	fire(string(takedowns.ControlSource)) // the orders
	order := map[string]takedowns.Order{}
	for _, n := range []string{"edge-a", "edge-b"} {
		var o api.OrdersResponse
		r := call(producer, node(n), "GET", "/v1/orders", "limit=10", nil)
		if json.Unmarshal([]byte(r.Body), &o); r.StatusCode != 200 || len(o.Orders) != 1 || o.Node != n {
			t.Fatalf("%s's orders: %d %s", n, r.StatusCode, r.Body)
		}
		order[n] = o.Orders[0]
	}
	line := func(n string) []byte {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, n+".crt"), filepath.Join(dir, n+".key"))
		if err != nil {
			t.Fatal(err)
		}
		c.Leaf, _ = x509.ParseCertificate(c.Certificate[0])
		o := order[n]
		s, err := takedown.Sign(takedown.Receipt{Request: o.Request, ContentID: o.ContentID, SHA256: o.SHA256, Node: n, EvictedAt: time.Now().UTC()}, c)
		if err != nil {
			t.Fatal(err)
		}
		return s.MarshalLine()
	}
	if r := call(producer, node("edge-b"), "POST", "/v1/receipts", "", line("edge-a")); r.StatusCode != 422 || !strings.Contains(r.Body, "receipt_refused") {
		t.Fatalf("edge-a's receipt from edge-b: %d %s", r.StatusCode, r.Body)
	}
	for _, n := range []string{"edge-a", "edge-b"} {
		if r := call(producer, node(n), "POST", "/v1/receipts", "", line(n)); r.StatusCode != 200 {
			t.Fatalf("%s's receipt: %d %s", n, r.StatusCode, r.Body)
		}
	}
	fire(string(takedowns.ControlSource))
	res, err := d.SweepHandler().Handle(ctx, json.RawMessage(`{"scheduled_time":"2026-11-29T12:00:00Z","execution_id":"x"}`))
	if err != nil || res.Takedowns == nil || res.Takedowns.Open != 1 || res.Takedowns.Pending != 0 || res.Takedowns.Complete != 1 {
		t.Fatalf("sweep: %+v %+v %v", res, res.Takedowns, err)
	}
	if !strings.Contains(logs.String(), `"TakedownHoldersOverdue":0`) || !strings.Contains(logs.String(), `"TakedownsOpen":1`) {
		t.Fatalf("no takedown EMF line in the logs:\n%s", logs.String())
	}
	var st takedowns.Status
	r = call(operator, ops, "GET", "/v1/takedowns/"+td.ID, "", nil)
	if json.Unmarshal([]byte(r.Body), &st); r.StatusCode != 200 || !st.Complete || st.ReceiptsVerified != 2 {
		t.Fatalf("status: %d %s", r.StatusCode, r.Body)
	}
	r = call(operator, ops, "GET", "/v1/takedowns/"+td.ID+"/receipts", "", nil)
	vr, err := takedown.VerifyAll(strings.NewReader(r.Body), d.Config.TakedownRoots, time.Now())
	if err != nil || len(vr) != 2 || vr[0].Err != nil || vr[1].Err != nil {
		t.Fatalf("receipt file: %v %+v", err, vr)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
