//go:build unix

package rietest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relay-dev/relay/internal/rieproc"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamoemu"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/lambdainvoke/invoketest"
	"github.com/relay-dev/relay/infra/scheduler/schedulertest"
	"github.com/relay-dev/relay/relaycore"
)

// repoRoot is the module root, relative to this package.
const repoRoot = "../.."

// functions maps a SAM logical id to its package (template.yaml, sam.mk).
var functions = map[string]string{
	"FireFunction":  "./functions/fire",
	"SweepFunction": "./functions/sweep",
	"ApiFunction":   "./functions/api",
	// The operator API: the api function's code with RELAY_API_ROUTES=operator
	// (env.json), under its own role in template.yaml.
	"OpsFunction": "./functions/api",
}

// tools are the emulator and the bootstraps, built once per package
// run by TestMain and read-only afterwards.
type tools struct {
	rie        string
	bootstraps map[string]string // logical id -> binary
	skip       string            // non-empty: why the suite cannot run
}

var built tools

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "relay-rietest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "rietest:", err)
		os.Exit(1)
	}
	built, err = build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rietest:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

// build compiles the bootstraps into dir and locates (or installs) the
// emulator. Network trouble while installing yields a skip reason; any
// other failure is an error.
func build(dir string) (tools, error) {
	t := tools{bootstraps: map[string]string{}}
	for id, pkg := range functions {
		out := filepath.Join(dir, id, "bootstrap")
		cmd := exec.Command(goTool(), "build", "-tags", "lambda.norpc", "-o", out, pkg)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			return t, fmt.Errorf("build %s: %v\n%s", pkg, err, msg)
		}
		t.bootstraps[id] = out
	}
	if p := os.Getenv("RELAY_RIE"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return t, fmt.Errorf("RELAY_RIE=%s: %w", p, err)
		}
		t.rie = p
		return t, nil
	}
	version, err := pinnedRIEVersion()
	if err != nil {
		return t, err
	}
	gobin := filepath.Join(dir, "bin")
	cmd := exec.Command(goTool(), "install", "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@"+version)
	cmd.Env = append(os.Environ(), "GOBIN="+gobin)
	if msg, err := cmd.CombinedOutput(); err != nil {
		if offline(string(msg)) {
			t.skip = fmt.Sprintf("aws-lambda-rie@%s is not installed and cannot be downloaded (offline?): run `make tools` or set RELAY_RIE\n%s", version, msg)
			return t, nil
		}
		return t, fmt.Errorf("go install aws-lambda-rie@%s: %v\n%s", version, err, msg)
	}
	t.rie = filepath.Join(gobin, "aws-lambda-rie")
	return t, nil
}

// pinnedRIEVersion reads RIE_VERSION from the Makefile, the one place the
// emulator's version is pinned.
func pinnedRIEVersion() (string, error) {
	mk, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^RIE_VERSION\s*:?=\s*(\S+)`).FindSubmatch(mk)
	if m == nil {
		return "", fmt.Errorf("Makefile pins no RIE_VERSION")
	}
	return string(m[1]), nil
}

func offline(msg string) bool {
	for _, s := range []string{"dial tcp", "no such host", "connection refused", "network is unreachable", "i/o timeout", "GOPROXY=off", "GOFLAGS=-mod=vendor"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func needTools(t *testing.T) {
	t.Helper()
	if built.skip != "" {
		t.Skip(built.skip)
	}
}

// function is one bootstrap running under the emulator.
type function struct {
	id     string
	invURL string
	log    *rieproc.Buffer
	// invoked counts invocations made through invoke (see settled).
	invoked atomic.Int64
}

// settled waits until the emulator has written the END line of every
// invocation made so far to the log. The function's output reaches the
// log through a pipe copied by another goroutine, so a line the bootstrap
// printed before answering may still be in flight when the answer
// arrives; the emulator writes END after the invocation, in the same
// stream, so once it is there everything before it is too. (Another
// process: there is nothing to wait on but its output.)
func (f *function) settled(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s := f.log.String()
		if int64(strings.Count(s, "END RequestId:")) >= f.invoked.Load() {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d invocations but %d END lines after 15s:\n%s", f.id, f.invoked.Load(), strings.Count(s, "END RequestId:"), s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// start runs the function's bootstrap under the emulator with env (and
// nothing else from the test's environment) and waits until the emulator
// listens.
func start(t *testing.T, id string, env map[string]string) *function {
	t.Helper()
	return startWithTimeout(t, id, env, 60*time.Second)
}

// startWithTimeout is start with the emulator enforcing function timeout
// timeout.
func startWithTimeout(t *testing.T, id string, env map[string]string, timeout time.Duration) *function {
	t.Helper()
	f := &function{id: id, log: &rieproc.Buffer{}}
	// HOME is empty: no shared AWS config files leak in.
	p, err := rieproc.Start(rieproc.Config{RIE: built.rie, Bootstrap: built.bootstraps[id], Env: env,
		Home: t.TempDir(), Timeout: timeout, Output: f.log})
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	f.invURL = p.URL
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s emulator output:\n%s", id, f.log.String())
		}
	})
	return f
}

// invoke posts payload to the function and returns the HTTP status and
// body. Handler errors come back as 200 with errorMessage/errorType.
// logContains waits (up to 15s) for the emulator's output to contain s,
// for the same reason as settled, and reports whether it did.
func (f *function) logContains(s string) bool {
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(f.log.String(), s) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

func (f *function) invoke(t *testing.T, payload []byte) (int, []byte) {
	t.Helper()
	f.invoked.Add(1)
	resp, err := http.Post(f.invURL, "application/json", bytes.NewReader(payload))
	if err != nil {
		t.Fatalf("invoke %s: %v", f.id, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("invoke %s: read: %v", f.id, err)
	}
	return resp.StatusCode, body
}

// invokeOK invokes and decodes a successful result into out; a handler
// error fails the test.
func (f *function) invokeOK(t *testing.T, payload []byte, out any) {
	t.Helper()
	status, body := f.invoke(t, payload)
	if status != http.StatusOK || bytes.Contains(body, []byte(`"errorMessage"`)) {
		t.Fatalf("%s: %d %s", f.id, status, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		t.Fatalf("%s: response %s: %v", f.id, body, err)
	}
}

// lambdaError is the emulator's body for a handler error.
type lambdaError struct {
	ErrorMessage string `json:"errorMessage"`
	ErrorType    string `json:"errorType"`
}

func readEvent(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "events", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// txRecord is one write request seen by the recording proxy: a
// TransactWriteItems, or a PutItem or DeleteItem (infra/dynamo's request
// for a batch on one key) recorded as a transaction of that one action
// under a token of its own, so the checks below see every batch.
type txRecord struct {
	token  string
	status int
	body   []byte
}

// rig is one test's world: DynamoDB (two tables) behind a recording proxy,
// a recording Scheduler, a recording Lambda endpoint per function (async
// invokes: the fire function's continuations), and the functions'
// environment from env.json.
type rig struct {
	t      *testing.T
	ddb    *dynamoemu.Endpoint
	rp     *httputil.ReverseProxy
	source *dynamo.Store
	target *dynamo.Store
	sched  *schedulertest.Server
	lam    map[string]*invoketest.Server // by function (logical id)

	mu    sync.Mutex
	txs   []txRecord
	calls map[grant]bool // IAM grants the functions' requests needed
}

const (
	sourceTable = "relay-source"
	targetTable = "relay-target"
)

func newRig(t *testing.T) *rig {
	t.Helper()
	needTools(t)
	r := &rig{t: t, ddb: dynamotest.Start(t), sched: schedulertest.Start(t), calls: map[grant]bool{}, lam: map[string]*invoketest.Server{}}
	upstream, err := url.Parse(r.ddb.URL)
	if err != nil {
		t.Fatal(err)
	}
	// dynamotest answers with X-Amz-Crc32 like DynamoDB, so the proxy
	// passes responses through untouched and the SDK's checksum check runs.
	r.rp = httputil.NewSingleHostReverseProxy(upstream)
	client := r.ddb.Client(nil)
	for _, tbl := range []string{sourceTable, targetTable} {
		if err := dynamo.CreateTable(t.Context(), client, tbl); err != nil {
			t.Fatal(err)
		}
	}
	r.source = dynamo.New(client, sourceTable, dynamo.Options{})
	r.target = dynamo.New(client, targetTable, dynamo.Options{})
	// Registered after the endpoints, so it runs before they close.
	t.Cleanup(r.checkGrants)
	return r
}

// proxy starts a recording proxy to DynamoDB for one function: it notes
// the IAM grant each request needs and keeps TransactWriteItems bodies.
func (r *rig) proxy(fn string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		op := req.Header.Get("X-Amz-Target")
		op = op[strings.LastIndexByte(op, '.')+1:]
		rec := &statusRecorder{ResponseWriter: w, status: 200}
		r.rp.ServeHTTP(rec, req)
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, g := range grantsFor(fn, op, body) {
			r.calls[g] = true
		}
		switch op {
		case "TransactWriteItems":
			var in struct{ ClientRequestToken string }
			_ = json.Unmarshal(body, &in)
			r.txs = append(r.txs, txRecord{token: in.ClientRequestToken, status: rec.status, body: body})
		case "PutItem", "DeleteItem":
			action := map[string]string{"PutItem": "Put", "DeleteItem": "Delete"}[op]
			r.txs = append(r.txs, txRecord{token: fmt.Sprintf("single-%d", len(r.txs)), status: rec.status,
				body: fmt.Appendf(nil, `{"TransactItems":[{%q:%s}]}`, action, body)})
		}
	}))
	r.t.Cleanup(srv.Close)
	return srv.URL
}

// lambda returns the function's recording Lambda endpoint, which accepts
// async invokes of the fire function (fireARN). Each function gets its own,
// so checkGrants knows who invoked.
func (r *rig) lambda(fn, fireARN string) *invoketest.Server {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.lam[fn]; ok {
		return s
	}
	s := invoketest.Start(r.t, fireARN)
	r.lam[fn] = s
	return s
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// env is the function's section of env.json with the endpoints pointed at
// this rig (env.json points at the host of a SAM container) and overrides
// applied.
func (r *rig) env(id string, overrides map[string]string) map[string]string {
	r.t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "env.json"))
	if err != nil {
		r.t.Fatal(err)
	}
	var all map[string]map[string]string
	if err := json.Unmarshal(data, &all); err != nil {
		r.t.Fatal(err)
	}
	env, ok := all[id]
	if !ok {
		r.t.Fatalf("env.json has no %s section", id)
	}
	env["RELAY_DYNAMODB_ENDPOINT"] = r.proxy(id)
	env["RELAY_SCHEDULER_ENDPOINT"] = r.sched.URL
	env["RELAY_LAMBDA_ENDPOINT"] = r.lambda(id, env["FIRE_FUNCTION_ARN"]).URL
	if _, ok := env["FAST_KICK"]; ok {
		// env.json turns the fast kick off for sam local invoke, which has
		// no Lambda endpoint to take it; the rig has one, as AWS does, so
		// it runs the template's default.
		env["FAST_KICK"] = "true"
	}
	env["AWS_REGION"] = "us-east-1"
	env["AWS_ACCESS_KEY_ID"] = "relay"
	env["AWS_SECRET_ACCESS_KEY"] = "relay"
	if env["SOURCE_TABLE"] != sourceTable || env["TARGET_TABLE"] != targetTable {
		r.t.Fatalf("env.json %s tables %s/%s, the rig creates %s/%s", id, env["SOURCE_TABLE"], env["TARGET_TABLE"], sourceTable, targetTable)
	}
	for k, v := range overrides {
		env[k] = v
	}
	return env
}

func (r *rig) start(id string, overrides map[string]string) *function {
	return start(r.t, id, r.env(id, overrides))
}

// committed returns the TransactWriteItems requests that committed, one
// per client token (a repeated token is DynamoDB's idempotent replay).
func (r *rig) committed() []txRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	var out []txRecord
	for _, tx := range r.txs {
		if tx.status != 200 || seen[tx.token] {
			continue
		}
		seen[tx.token] = true
		out = append(out, tx)
	}
	return out
}

// txCount returns how many write requests (txRecord) were sent to
// table ("" for any) and how many of them failed.
func (r *rig) txCount(table string) (sent, failed int) {
	r.t.Helper()
	r.mu.Lock()
	txs := slices.Clone(r.txs)
	r.mu.Unlock()
	for _, tx := range txs {
		if table != "" && txTable(r.t, tx.body) != table {
			continue
		}
		sent++
		if tx.status != 200 {
			failed++
		}
	}
	return sent, failed
}

// txTable is the table a relay transaction writes (each batch is one
// partition of one table).
func txTable(t *testing.T, body []byte) string {
	t.Helper()
	var w wireTx
	if err := json.Unmarshal(body, &w); err != nil {
		t.Fatalf("decode transaction: %v", err)
	}
	for _, it := range w.TransactItems {
		switch {
		case it.Put != nil:
			return it.Put.TableName
		case it.Delete != nil:
			return it.Delete.TableName
		case it.ConditionCheck != nil:
			return it.ConditionCheck.TableName
		}
	}
	return ""
}

// wireAttr and wireTx are the parts of a TransactWriteItems body the
// checks read.
type wireAttr struct {
	S string `json:"S"`
	B []byte `json:"B"`
	N string `json:"N"`
}

type wireTx struct {
	TransactItems []struct {
		Put *struct {
			TableName string
			Item      map[string]wireAttr
		}
		Delete, ConditionCheck *struct {
			TableName string
			Key       map[string]wireAttr
		}
	}
}

// rhWrites lists, per target partition, the rh values written by committed
// target transactions for source, in commit order.
func (r *rig) rhWrites(source relaycore.Partition) map[string][]string {
	r.t.Helper()
	out := map[string][]string{}
	rhKey := relaycore.RHKey(source)
	for _, tx := range r.committed() {
		var w wireTx
		if err := json.Unmarshal(tx.body, &w); err != nil {
			r.t.Fatalf("decode transaction: %v", err)
		}
		for _, it := range w.TransactItems {
			if it.Put == nil || it.Put.TableName != targetTable || it.Put.Item["k"].S != rhKey {
				continue
			}
			p := it.Put.Item["p"].S
			out[p] = append(out[p], string(it.Put.Item["v"].B))
		}
	}
	return out
}

// urlResponse is the function URL response the api function returns.
type urlResponse struct {
	StatusCode int               `json:"statusCode"`
	Headers    map[string]string `json:"headers"`
	Body       string            `json:"body"`
}

// apiCall invokes the api function with a function URL event and decodes
// the HTTP response body into out (when non-nil).
func apiCall(t *testing.T, api *function, payload []byte, wantStatus int, out any) urlResponse {
	t.Helper()
	var resp urlResponse
	api.invokeOK(t, payload, &resp)
	if resp.StatusCode != wantStatus {
		t.Fatalf("api: HTTP %d %s, want %d", resp.StatusCode, resp.Body, wantStatus)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(resp.Body), out); err != nil {
			t.Fatalf("api body %s: %v", resp.Body, err)
		}
	}
	return resp
}

// withPath returns a function URL event (events/api-query.json) for a
// GET of path?query.
func withPath(t *testing.T, method, path, query, body string) []byte {
	t.Helper()
	var ev map[string]any
	base := "api-query.json"
	if method == "POST" {
		base = "api-enqueue.json"
	}
	if err := json.Unmarshal(readEvent(t, base), &ev); err != nil {
		t.Fatal(err)
	}
	ev["rawPath"] = path
	ev["rawQueryString"] = query
	delete(ev, "queryStringParameters")
	ev["requestContext"].(map[string]any)["http"].(map[string]any)["path"] = path
	if body != "" {
		ev["body"] = body
	}
	data, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
