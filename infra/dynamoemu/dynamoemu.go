// Package dynamoemu serves the DynamoDB API in process: a plain net/http
// server on 127.0.0.1 in front of github.com/truora/minidyn/server,
// reached through the real aws-sdk-go-v2 client over real HTTP. The relay
// demo's --store dynamo runs on it without AWS, and the tests run on it
// through infra/dynamotest. It links neither testing nor net/http/httptest,
// so the binaries that embed it carry no test code.
//
// minidyn is not DynamoDB. The handler here fixes the gaps that would
// otherwise make the demo and the tests lie or race (see Endpoint);
// everything else minidyn gets wrong is listed in docs/dynamodb.md and
// must not be relied on.
package dynamoemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/truora/minidyn/server"
)

// Endpoint is a running in-process DynamoDB-API server.
//
// Compared with bare minidyn it adds:
//   - table-level locking: minidyn's CreateTable/DeleteTable mutate its
//     table map without its own mutex, and its DescribeTable counts a
//     table's items without the table's (racing every write), so they run
//     exclusively here;
//   - ClientRequestToken idempotency for TransactWriteItems, which minidyn
//     ignores but DynamoDB honours (a repeated token with the same request
//     returns success without applying again; with a different request it
//     fails with IdempotentParameterMismatchException). Tokens never expire
//     here; DynamoDB forgets them after 10 minutes;
//   - BatchGetItem's refusal of a key listed twice for one table
//     (ValidationException "Provided list of item keys contains
//     duplicates"), which minidyn answers instead, so a client that sends
//     duplicates fails here as it would on DynamoDB; likewise
//     BatchWriteItem's refusal of a DeleteRequest key listed twice.
//
// minidyn's BatchGetItem is otherwise faithful enough: it accepts
// ConsistentRead (every minidyn read is consistent), refuses more than 100
// keys, omits absent keys, and reads each key on its own, as DynamoDB does.
// Mini.EmulateUnprocessedItems makes it return UnprocessedKeys.
type Endpoint struct {
	// URL is the endpoint's base URL (http://127.0.0.1:port).
	URL string
	// Mini is the minidyn server, for its failure emulation.
	Mini *server.Server

	srv *http.Server

	tableMu sync.RWMutex

	tokMu     sync.Mutex
	tokens    map[string]tokenState
	rawTokens bool
}

type tokenState struct {
	digest  [32]byte
	pending bool
}

// New runs an endpoint on 127.0.0.1 (a port the system picks) until
// Close.
func New() (*Endpoint, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("dynamoemu: listen: %w", err)
	}
	e := &Endpoint{
		URL:    "http://" + l.Addr().String(),
		Mini:   server.NewServer(),
		tokens: map[string]tokenState{},
	}
	e.srv = &http.Server{Handler: http.HandlerFunc(e.serve)}
	go func() { _ = e.srv.Serve(l) }() // returns http.ErrServerClosed at Close
	return e, nil
}

// NewHandler returns an endpoint that does not listen: it answers through
// ServeHTTP only, for clients whose transport calls it in memory (a
// simulation on virtual time, testing/synctest, must not wait on sockets).
// Its URL is empty and Close does nothing.
func NewHandler() *Endpoint {
	return &Endpoint{Mini: server.NewServer(), tokens: map[string]tokenState{}}
}

// ServeHTTP answers one DynamoDB API request, as the listening endpoint
// does.
func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.serve(w, r) }

// Close stops the endpoint once the requests it is answering are done;
// its tables are gone.
func (e *Endpoint) Close() {
	if e.srv != nil {
		_ = e.srv.Shutdown(context.Background())
	}
}

// IgnoreTokens makes the endpoint behave like bare minidyn, which ignores
// ClientRequestToken: a repeated request is executed again. Tests use it
// to show what the store does when the endpoint cannot resolve an
// ambiguous attempt.
func (e *Endpoint) IgnoreTokens() {
	e.tokMu.Lock()
	e.rawTokens = true
	e.tokMu.Unlock()
}

// Tokens reports how many distinct ClientRequestTokens have committed.
func (e *Endpoint) Tokens() int {
	e.tokMu.Lock()
	defer e.tokMu.Unlock()
	n := 0
	for _, s := range e.tokens {
		if !s.pending {
			n++
		}
	}
	return n
}

// serve answers like DynamoDB, including the X-Amz-Crc32 header DynamoDB
// puts on every response (minidyn omits it, and the SDK logs a warning for
// each response without it).
func (e *Endpoint) serve(w http.ResponseWriter, r *http.Request) {
	rec := newRecorder()
	e.handle(rec, r)
	body := rec.body.Bytes()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10))
	w.WriteHeader(rec.code)
	_, _ = w.Write(body)
}

// recorder buffers a response (status, headers, body) so serve can checksum
// it and handle can look at minidyn's status before answering.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
	wrote  bool
}

func newRecorder() *recorder { return &recorder{header: http.Header{}, code: http.StatusOK} }

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader keeps the first status, as a real response does.
func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.code, r.wrote = code, true
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.wrote = true
	return r.body.Write(p)
}

// respond copies a buffered response to w.
func (r *recorder) respond(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.code)
	_, _ = w.Write(r.body.Bytes())
}

func (e *Endpoint) handle(w http.ResponseWriter, r *http.Request) {
	op := r.Header.Get("X-Amz-Target")
	op = op[strings.LastIndexByte(op, '.')+1:]
	switch op {
	case "CreateTable", "DeleteTable", "UpdateTable", "DescribeTable":
		e.tableMu.Lock()
		defer e.tableMu.Unlock()
	default:
		e.tableMu.RLock()
		defer e.tableMu.RUnlock()
	}
	if op != "TransactWriteItems" && op != "BatchGetItem" && op != "BatchWriteItem" {
		e.Mini.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if op == "BatchGetItem" || op == "BatchWriteItem" {
		if duplicateBatchKeys(op, body) {
			writeAPIError(w, "ValidationException", "Provided list of item keys contains duplicates")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		e.Mini.ServeHTTP(w, r)
		return
	}
	var in struct{ ClientRequestToken string }
	_ = json.Unmarshal(body, &in)
	e.tokMu.Lock()
	raw := e.rawTokens
	e.tokMu.Unlock()
	if in.ClientRequestToken == "" || raw {
		r.Body = io.NopCloser(bytes.NewReader(body))
		e.Mini.ServeHTTP(w, r)
		return
	}
	digest := canonicalDigest(body)
	e.tokMu.Lock()
	st, seen := e.tokens[in.ClientRequestToken]
	switch {
	case seen && st.digest != digest:
		e.tokMu.Unlock()
		writeAPIError(w, "IdempotentParameterMismatchException", "token reused with a different request")
		return
	case seen && st.pending:
		e.tokMu.Unlock()
		writeAPIError(w, "TransactionInProgressException", "transaction with this token is in progress")
		return
	case seen:
		e.tokMu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = io.WriteString(w, "{}")
		return
	}
	e.tokens[in.ClientRequestToken] = tokenState{digest: digest, pending: true}
	e.tokMu.Unlock()

	rec := newRecorder()
	r.Body = io.NopCloser(bytes.NewReader(body))
	e.Mini.ServeHTTP(rec, r)

	e.tokMu.Lock()
	if rec.code == http.StatusOK {
		e.tokens[in.ClientRequestToken] = tokenState{digest: digest}
	} else {
		delete(e.tokens, in.ClientRequestToken)
	}
	e.tokMu.Unlock()
	rec.respond(w)
}

// duplicateBatchKeys reports whether a BatchGetItem request lists one key
// twice for a table, or a BatchWriteItem request one DeleteRequest key.
// Keys are compared canonically (the SDK writes a key's attributes in
// random order). BatchWriteItem's PutRequests are not compared: telling
// their keys apart from their other attributes needs the table's schema,
// and the relay sends none.
func duplicateBatchKeys(op string, body []byte) bool {
	var keys map[string][]json.RawMessage
	if op == "BatchGetItem" {
		var in struct {
			RequestItems map[string]struct{ Keys []json.RawMessage }
		}
		if json.Unmarshal(body, &in) != nil {
			return false // minidyn reports the malformed request
		}
		keys = make(map[string][]json.RawMessage, len(in.RequestItems))
		for t, r := range in.RequestItems {
			keys[t] = r.Keys
		}
	} else {
		var in struct {
			RequestItems map[string][]struct {
				DeleteRequest *struct{ Key json.RawMessage }
			}
		}
		if json.Unmarshal(body, &in) != nil {
			return false
		}
		keys = make(map[string][]json.RawMessage, len(in.RequestItems))
		for t, rs := range in.RequestItems {
			for _, r := range rs {
				if r.DeleteRequest != nil {
					keys[t] = append(keys[t], r.DeleteRequest.Key)
				}
			}
		}
	}
	for _, ks := range keys {
		seen := make(map[string]bool, len(ks))
		for _, k := range ks {
			c := string(CanonicalJSON(k))
			if seen[c] {
				return true
			}
			seen[c] = true
		}
	}
	return false
}

// canonicalDigest hashes a JSON request independent of member order (the
// SDK writes maps in random order; DynamoDB compares parameters, not
// bytes).
func canonicalDigest(body []byte) [32]byte { return sha256.Sum256(CanonicalJSON(body)) }

// CanonicalJSON re-encodes a JSON document with sorted object keys: two
// requests with the same parameters encode alike (tests compare requests
// with it).
func CanonicalJSON(body []byte) []byte {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return body
	}
	canon, err := json.Marshal(v)
	if err != nil {
		return body
	}
	return canon
}

func writeAPIError(w http.ResponseWriter, typ, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": typ, "message": msg})
}

// Client returns an SDK client for the endpoint. rt, when non-nil, wraps
// the HTTP transport (fault injection); otherwise the default transport is
// used.
func (e *Endpoint) Client(rt http.RoundTripper) *dynamodb.Client {
	return NewClient(e.URL, rt)
}

// NewClient returns an SDK client for a DynamoDB-API endpoint with static
// dummy credentials (minidyn checks no signature).
func NewClient(endpoint string, rt http.RoundTripper) *dynamodb.Client {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("relay", "relay", ""),
		HTTPClient:   &http.Client{Transport: rt},
	})
}
