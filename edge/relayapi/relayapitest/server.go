// Package relayapitest is a strict stand-in for the relay side of the
// takedown HTTP contract (POST /v1/holdings, GET /v1/orders, POST
// /v1/receipts), over real TLS on 127.0.0.1, for tests of edged's client
// (edge/relayapi) in process and of real edged processes (edge/e2e).
//
// It checks every request against the contract: method, path, query,
// headers, body limits and shape, the Idempotency-Key rule and its reuse,
// the caller's identity (its client certificate's node id, verified
// against the CA; or a SigV4 signature recomputed with the test's
// credentials), and for a receipt what the relay checks: the signature and
// chain against the CA, the node, an order for that request to that node
// and its digest. A request that breaks the contract is answered 400 and
// recorded as a violation; Violations must be empty at the end of a test
// (New registers that check with t.Cleanup).
//
// Faults are injected around the real exchange: Inject queues, per route,
// what the next requests meet (an answer lost after the request took
// effect, a 503 before it did, a 4xx), and Down/Up take the listener away
// and bring it back on the same address.
package relayapitest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/takedown"
	"github.com/relay-dev/relay/edge/wire"
)

// Contract limits.
const (
	MaxReports   = 500
	MaxBodyBytes = 1 << 20
	MaxLimit     = 500
	DefaultLimit = 100
)

// Routes, as Inject and Requests name them.
const (
	Holdings = "holdings"
	Orders   = "orders"
	Receipts = "receipts"
)

// Fault is what one request meets.
type Fault int

const (
	// LoseAnswer: the request takes effect, then the connection is cut
	// before the answer (the client cannot tell whether it did).
	LoseAnswer Fault = iota + 1
	// Unavailable: 503 before anything is done.
	Unavailable
	// Refuse: 422 before anything is done (a refusal the client must not
	// retry as is).
	Refuse
	// TooLarge: 413 too_large before anything is done, as the relay
	// answers a batch over its own bound on one idempotent request.
	TooLarge
)

// Options configure a Server.
type Options struct {
	// PKIDir holds the CA (ca.crt, ca.key) that issues the server's
	// certificate and that client certificates and receipts must chain
	// to; a new CA is made in a temp dir if empty.
	PKIDir string
	// SigV4, if set, authenticates callers by SigV4 (service lambda)
	// signed with these credentials instead of client certificates; the
	// caller's node is SigV4Node.
	SigV4     *aws.Credentials
	Region    string
	SigV4Node string
	// Addr to listen on; default 127.0.0.1:0.
	Addr string
}

// Report is one holdings report as received.
type Report struct {
	ContentID  string `json:"content_id"`
	SHA256     string `json:"sha256"`
	Size       int64  `json:"size"`
	State      string `json:"state"`
	ObservedMS int64  `json:"observed_ms"`
}

// Order is one order as the server hands it out.
type Order struct {
	Cursor      string `json:"cursor"`
	Request     string `json:"request"`
	ContentID   string `json:"content_id"`
	SHA256      string `json:"sha256"`
	Takedown    string `json:"takedown"`
	Reason      string `json:"reason"`
	RequestedMS int64  `json:"requested_ms"`
	node        string
}

// Request is one request the server received, as it came.
type Request struct {
	Route, Node, Key string
	Query            string
	Body             []byte
	Fault            Fault
}

// Server is the contract's relay side.
type Server struct {
	t    testing.TB
	opt  Options
	ca   *x509.CertPool
	cert tls.Certificate
	addr string

	mu         sync.Mutex
	srv        *http.Server
	faults     map[string][]Fault
	requests   []Request
	violations []string
	holdings   map[string]map[string]Report // node → content → last report
	applied    map[string][]Report          // node → every report applied, in order
	keys       map[string]keyed             // node NUL key → the batch
	orders     []Order
	receipts   map[string]string // request → the accepted line
	seq        int
	onRequest  func(Request)
}

type keyed struct {
	sum    [sha256.Size]byte
	answer []byte
}

// New starts a server; it stops with the test, which fails if any request
// broke the contract.
func New(t testing.TB, opt Options) *Server {
	t.Helper()
	if opt.PKIDir == "" {
		opt.PKIDir = t.TempDir()
		if _, err := pki.InitCA(opt.PKIDir, pki.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	if opt.Addr == "" {
		opt.Addr = "127.0.0.1:0"
	}
	s := &Server{t: t, opt: opt, faults: map[string][]Fault{}, holdings: map[string]map[string]Report{},
		applied: map[string][]Report{}, keys: map[string]keyed{}, receipts: map[string]string{}}
	dir := t.TempDir()
	if err := copyFile(filepath.Join(opt.PKIDir, pki.CACertFile), filepath.Join(dir, pki.CACertFile)); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(filepath.Join(opt.PKIDir, pki.CAKeyFile), filepath.Join(dir, pki.CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	p, err := pki.Issue(dir, "relay", pki.Options{Usage: pki.UsageServer})
	if err != nil {
		t.Fatal(err)
	}
	if s.cert, err = tls.LoadX509KeyPair(p.Cert, p.Key); err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(filepath.Join(opt.PKIDir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	s.ca = x509.NewCertPool()
	s.ca.AppendCertsFromPEM(pem)
	s.Up()
	t.Cleanup(func() {
		s.Down()
		for _, v := range s.Violations() {
			t.Errorf("contract violation: %s", v)
		}
	})
	return s
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}

// URL is the base URL (https://127.0.0.1:port).
func (s *Server) URL() string { return "https://" + s.addr }

// CAFile is the CA certificate file the server's certificate chains to.
func (s *Server) CAFile() string { return filepath.Join(s.opt.PKIDir, pki.CACertFile) }

// Up listens (again, on the same address after Down).
func (s *Server) Up() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return
	}
	addr := s.opt.Addr
	if s.addr != "" {
		addr = s.addr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.t.Fatalf("relayapitest: listen %s: %v", addr, err)
	}
	s.addr = ln.Addr().String()
	auth := tls.RequireAndVerifyClientCert
	if s.opt.SigV4 != nil {
		auth = tls.NoClientCert
	}
	tc := &tls.Config{Certificates: []tls.Certificate{s.cert}, ClientCAs: s.ca, ClientAuth: auth, MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"}}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)}
	srv := s.srv
	go srv.Serve(tls.NewListener(ln, tc))
}

// Down closes the listener and every connection: the relay is gone until
// Up.
func (s *Server) Down() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// Inject queues faults for the next requests on route, one each.
func (s *Server) Inject(route string, faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[route] = append(s.faults[route], faults...)
}

// OnRequest is called with each request before it is answered (after its
// checks and its effect, before a lost answer is cut), outside the
// server's lock: a test can block there, kill a process, count.
func (s *Server) OnRequest(f func(Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRequest = f
}

// AddOrder orders node to evict content, whose digest the holder index
// has as sha, and returns the order.
func (s *Server) AddOrder(node, content, sha, takedownID, reason string) Order {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	ms := time.Now().UnixMilli() + int64(s.seq) // distinct per order
	o := Order{Cursor: fmt.Sprintf("c%012d", s.seq), Request: fmt.Sprintf("%s/%s/%019d", content, node, ms), ContentID: content,
		SHA256: sha, Takedown: takedownID, Reason: reason, RequestedMS: ms, node: node}
	s.orders = append(s.orders, o)
	return o
}

// Holdings returns what node last reported, by content id.
func (s *Server) Holdings(node string) map[string]Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]Report{}
	for k, v := range s.holdings[node] {
		out[k] = v
	}
	return out
}

// Applied returns every report of node applied, in order.
func (s *Server) Applied(node string) []Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.applied[node])
}

// Receipts returns the accepted receipt lines by request.
func (s *Server) Receipts() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.receipts {
		out[k] = v
	}
	return out
}

// Requests returns every request received on route ("" = all), in order.
func (s *Server) Requests(route string) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Request
	for _, r := range s.requests {
		if route == "" || r.Route == route {
			out = append(out, r)
		}
	}
	return out
}

// Violations lists the contract breaches seen.
func (s *Server) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.violations)
}

// answer is a handler's outcome.
type answer struct {
	status int
	body   any
}

func problem(status int, code, format string, args ...any) answer {
	return answer{status, map[string]any{"error": map[string]string{"code": code, "message": fmt.Sprintf(format, args...)}}}
}

// violation is a request the contract forbids.
type violation struct{ msg string }

func (v violation) Error() string { return v.msg }

func breach(format string, args ...any) error { return violation{fmt.Sprintf(format, args...)} }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	route := map[string]string{"/v1/holdings": Holdings, "/v1/orders": Orders, "/v1/receipts": Receipts}[r.URL.Path]
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return // the client went away
	}
	node, err := s.caller(r, body)
	req := Request{Route: route, Node: node, Key: r.Header.Get("Idempotency-Key"), Query: r.URL.RawQuery, Body: body}
	var ans answer
	if err == nil {
		err = checkCommon(r, route, body)
	}
	s.mu.Lock()
	if q := s.faults[route]; err == nil && len(q) > 0 {
		req.Fault, s.faults[route] = q[0], q[1:]
	}
	s.requests = append(s.requests, req)
	switch {
	case err != nil:
	case req.Fault == Unavailable:
		ans = problem(http.StatusServiceUnavailable, "unavailable", "injected: relay unavailable")
	case req.Fault == Refuse:
		ans = problem(http.StatusUnprocessableEntity, "receipt_refused", "injected: refused")
	case req.Fault == TooLarge:
		ans = problem(http.StatusRequestEntityTooLarge, "too_large", "injected: send fewer reports per request")
	case route == Holdings:
		ans, err = s.holdingsLocked(node, req.Key, body)
	case route == Orders:
		ans, err = s.ordersLocked(node, r)
	case route == Receipts:
		ans, err = s.receiptLocked(node, body)
	}
	if v := (violation{}); errors.As(err, &v) {
		s.violations = append(s.violations, fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, v.msg))
		ans = problem(http.StatusBadRequest, "bad_request", "%s", v.msg)
	} else if err != nil {
		ans = problem(http.StatusUnauthorized, "unauthenticated", "%v", err)
	}
	hook := s.onRequest
	s.mu.Unlock()
	if hook != nil {
		hook(req)
	}
	if req.Fault == LoseAnswer {
		panic(http.ErrAbortHandler) // cuts the stream (HTTP/2) or the connection
	}
	b, _ := json.Marshal(ans.body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ans.status)
	w.Write(b)
}

// caller names the node: its client certificate's node id, or the SigV4
// identity. An unverifiable credential is an error (401), not a breach.
func (s *Server) caller(r *http.Request, body []byte) (string, error) {
	if s.opt.SigV4 != nil {
		if err := s.checkSigV4(r, body); err != nil {
			return "", err
		}
		return s.opt.SigV4Node, nil
	}
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return "", errors.New("no client certificate")
	}
	c := r.TLS.PeerCertificates[0]
	if _, err := c.Verify(x509.VerifyOptions{Roots: s.ca, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", err
	}
	return pki.NodeID(c)
}

// checkSigV4 recomputes the request's signature with the test's
// credentials, over the headers it says it signed, at its own time.
func (s *Server) checkSigV4(r *http.Request, body []byte) error {
	auth := r.Header.Get("Authorization")
	_, signed, ok := strings.Cut(auth, "SignedHeaders=")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") || !ok {
		return fmt.Errorf("not SigV4: %q", auth)
	}
	signed, _, _ = strings.Cut(signed, ",")
	if !strings.Contains(auth, "/"+s.opt.Region+"/lambda/aws4_request") {
		return fmt.Errorf("signed for another region or service: %q", auth)
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return fmt.Errorf("X-Amz-Date: %v", err)
	}
	u := *r.URL
	u.Scheme, u.Host = "https", r.Host
	re, _ := http.NewRequest(r.Method, u.String(), bytes.NewReader(body))
	re.ContentLength = r.ContentLength
	for _, h := range strings.Split(signed, ";") {
		switch h {
		case "host", "content-length":
		default:
			re.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	re.Header.Del("Authorization")
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), *s.opt.SigV4, re, hex.EncodeToString(sum[:]), "lambda", s.opt.Region, at); err != nil {
		return err
	}
	if re.Header.Get("Authorization") != auth {
		return errors.New("SigV4 signature does not match")
	}
	return nil
}

var idemKey = regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,128}$`)

// checkCommon checks what every route shares.
func checkCommon(r *http.Request, route string, body []byte) error {
	method := map[string]string{Holdings: http.MethodPost, Orders: http.MethodGet, Receipts: http.MethodPost}[route]
	switch {
	case route == "":
		return breach("no such route")
	case r.Method != method:
		return breach("method %s, want %s", r.Method, method)
	case len(body) > MaxBodyBytes:
		return breach("body over %d bytes", MaxBodyBytes)
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Accept")); mt != "application/json" {
		return breach("Accept %q, want application/json", r.Header.Get("Accept"))
	}
	if method == http.MethodGet {
		if len(body) > 0 || r.Header.Get("Idempotency-Key") != "" {
			return breach("a GET with a body or an Idempotency-Key")
		}
		return nil
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		return breach("Content-Type %q, want application/json", r.Header.Get("Content-Type"))
	}
	if r.URL.RawQuery != "" {
		return breach("a POST with a query %q", r.URL.RawQuery)
	}
	if route == Holdings {
		if k := r.Header.Values("Idempotency-Key"); len(k) != 1 || !idemKey.MatchString(k[0]) {
			return breach("Idempotency-Key %q: want one of 1..128 bytes of [A-Za-z0-9._:/-]", k)
		}
	} else if r.Header.Get("Idempotency-Key") != "" {
		return breach("Idempotency-Key on %s", route)
	}
	return nil
}

func strict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (s *Server) holdingsLocked(node, key string, body []byte) (answer, error) {
	var b struct {
		Reports []Report `json:"reports"`
	}
	if err := strict(body, &b); err != nil {
		return answer{}, breach("body: %v", err)
	}
	if n := len(b.Reports); n < 1 || n > MaxReports {
		return answer{}, breach("%d reports, want 1..%d", n, MaxReports)
	}
	seen := map[string]bool{}
	for i, r := range b.Reports {
		switch {
		case wire.CheckSegmentID(r.ContentID) != nil:
			return answer{}, breach("reports[%d].content_id %q", i, r.ContentID)
		case !hex64.MatchString(r.SHA256):
			return answer{}, breach("reports[%d].sha256 %q", i, r.SHA256)
		case r.Size < 0:
			return answer{}, breach("reports[%d].size %d", i, r.Size)
		case r.State != "held" && r.State != "evicted":
			return answer{}, breach("reports[%d].state %q", i, r.State)
		case r.ObservedMS <= 0:
			return answer{}, breach("reports[%d].observed_ms %d", i, r.ObservedMS)
		case seen[r.ContentID]:
			return answer{}, breach("reports[%d]: %s twice in one batch", i, r.ContentID)
		}
		seen[r.ContentID] = true
	}
	sum := sha256.Sum256(body)
	kk := node + "\x00" + key
	if k, ok := s.keys[kk]; ok {
		if k.sum != sum {
			return answer{}, breach("Idempotency-Key %s reused with another body", key)
		}
		var a map[string]any
		json.Unmarshal(k.answer, &a)
		a["replayed"] = true
		return answer{http.StatusOK, a}, nil
	}
	if s.holdings[node] == nil {
		s.holdings[node] = map[string]Report{}
	}
	for _, r := range b.Reports {
		s.holdings[node][r.ContentID] = r
		s.applied[node] = append(s.applied[node], r)
	}
	a := map[string]any{"node": node, "accepted": len(b.Reports), "replayed": false}
	raw, _ := json.Marshal(a)
	s.keys[kk] = keyed{sum: sum, answer: raw}
	return answer{http.StatusOK, a}, nil
}

func (s *Server) ordersLocked(node string, r *http.Request) (answer, error) {
	q := r.URL.Query()
	for k := range q {
		if k != "after" && k != "limit" {
			return answer{}, breach("query parameter %q", k)
		}
	}
	limit := DefaultLimit
	if v := q.Get("limit"); q.Has("limit") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxLimit {
			return answer{}, breach("limit %q, want 1..%d", v, MaxLimit)
		}
		limit = n
	}
	after := q.Get("after")
	if q.Has("after") && after == "" {
		return answer{}, breach("after given empty")
	}
	out := []Order{}
	next := ""
	for _, o := range s.orders {
		if o.node != node || o.Cursor <= after {
			continue
		}
		if len(out) == limit {
			next = out[len(out)-1].Cursor
			break
		}
		out = append(out, o)
	}
	return answer{http.StatusOK, map[string]any{"node": node, "orders": out, "next": next}}, nil
}

func (s *Server) receiptLocked(node string, body []byte) (answer, error) {
	line, ok := bytes.CutSuffix(body, []byte("\n"))
	if !ok || bytes.IndexByte(line, '\n') >= 0 {
		return answer{}, breach("body is not exactly one line of a receipt file")
	}
	sg, err := takedown.ParseLine(line)
	if err != nil {
		return answer{}, breach("receipt: %v", err)
	}
	rc := sg.Receipt
	if _, err := takedown.Verify(sg, s.ca, time.Now()); err != nil {
		return problem(http.StatusUnprocessableEntity, "receipt_refused", "%v", err), nil
	}
	if rc.Node != node {
		return problem(http.StatusUnprocessableEntity, "receipt_refused", "receipt of node %s posted by %s", rc.Node, node), nil
	}
	i := slices.IndexFunc(s.orders, func(o Order) bool { return o.Request == rc.Request && o.node == node })
	if i < 0 {
		return problem(http.StatusUnprocessableEntity, "receipt_refused", "no order for request %s to node %s", rc.Request, node), nil
	}
	if o := s.orders[i]; o.ContentID != rc.ContentID || o.SHA256 != rc.SHA256 {
		return problem(http.StatusUnprocessableEntity, "receipt_refused", "receipt for %s %s, the order is for %s %s", rc.ContentID, rc.SHA256, o.ContentID, o.SHA256), nil
	}
	_, replayed := s.receipts[rc.Request]
	s.receipts[rc.Request] = string(line)
	return answer{http.StatusOK, map[string]any{"request": rc.Request, "accepted": true, "replayed": replayed}}, nil
}
