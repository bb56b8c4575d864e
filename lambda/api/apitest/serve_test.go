package apitest_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api/apitest"
)

// relayBin is the relay binary, built once in TestMain.
var relayBin string

// The PostgreSQL cluster (pgtest) starts on first use and stops after
// the tests.
func TestMain(m *testing.M) { os.Exit(pgtest.After(servetest.Main(m, &relayBin))) }

// serveHost is `relay serve` as a separate process on a new store,
// with one bearer token per role: the producer may produce to any source
// and read, the operator reads and operates (the two function URLs'
// route sets). Its own alarm clock delivers, so Settle does nothing.
type serveHost struct {
	proc   *servetest.Proc
	client *http.Client
	tokens map[apitest.Role]string
}

// startServe runs relay serve on the store the YAML store block names
// (empty: a new bbolt file in a temp directory).
func startServe(t *testing.T, store string) *serveHost {
	t.Helper()
	dir := t.TempDir()
	tokens := map[apitest.Role]string{apitest.Producer: "relay_conformance_producer", apitest.Operator: "relay_conformance_operator"}
	var lines strings.Builder
	for role, tok := range tokens {
		fmt.Fprintf(&lines, "%s %s\n", role, relayserve.HashToken(tok))
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if store == "" {
		store = fmt.Sprintf("{type: bbolt}\ndb: %s", filepath.Join(dir, "relay.db"))
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
store: %s
auth: {tokens_file: %s}
principals:
  producer: {produce: ["*"], read: true}
  operator: {read: true, operate: true}
`, store, filepath.Join(dir, "tokens"))
	p := servetest.Start(t, relayBin, servetest.WriteConfig(t, cfg))
	t.Cleanup(func() {
		if code := p.Stop(t); code != 0 {
			t.Errorf("relay serve exited %d", code)
		}
	})
	return &serveHost{proc: p, client: p.Client(nil), tokens: tokens}
}

func (s *serveHost) Do(t testing.TB, req apitest.Request) apitest.Response {
	t.Helper()
	u := s.proc.URL + req.Path
	if req.Query != "" {
		u += "?" + req.Query
	}
	hr, err := http.NewRequestWithContext(t.Context(), req.Method, u, bytes.NewReader(req.Body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range req.Headers {
		hr.Header.Set(k, v)
	}
	hr.Header.Set("authorization", "Bearer "+s.tokens[req.Role])
	resp, err := s.client.Do(hr)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", req.Method, req.Path, err)
	}
	headers := map[string]string{}
	for k := range resp.Header {
		headers[strings.ToLower(k)] = strings.Join(resp.Header.Values(k), ", ")
	}
	return apitest.Response{Status: resp.StatusCode, Headers: headers, Body: body}
}

func (s *serveHost) Settle(testing.TB, string) {}

// TestServe runs the conformance scenario against `relay serve` over
// HTTP: the server's own layer (authentication, roles, body limit) must
// not change any answer the handler gives.
func TestServe(t *testing.T) {
	apitest.Run(t, startServe(t, ""), false)
}

// TestServePostgres runs it against relay serve on PostgreSQL (a new
// database of the pgtest cluster, over its Unix socket).
func TestServePostgres(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	apitest.Run(t, startServe(t, fmt.Sprintf("{type: postgres, postgres: {dsn: %q}}", dsn)), false)
}

// TestServeDynamoDB runs it against relay serve on DynamoDB: the
// in-process DynamoDB-API endpoint (minidyn), reached by the server
// process through the real SDK with credentials from its default chain
// (the environment). minidyn's secondary indexes are not reliable, so
// the sweep scans (due_index: scan).
func TestServeDynamoDB(t *testing.T) {
	ep := dynamotest.Start(t)
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "relay", "AWS_SECRET_ACCESS_KEY": "relay",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull} {
		t.Setenv(k, v)
	}
	apitest.Run(t, startServe(t, fmt.Sprintf(
		"{type: dynamodb, dynamodb: {source_table: src, target_table: dst, region: us-east-1, endpoint: %q, create_tables: true, due_index: scan}}", ep.URL)), false)
}
