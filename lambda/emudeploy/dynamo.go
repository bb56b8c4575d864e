package emudeploy

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/relaycore"
)

// DefaultDynamoLatency is the per-request latency added in front of the
// DynamoDB-API endpoint: DynamoDB's developer guide promises
// "single-digit millisecond" performance at any scale; a request here is
// held for a uniformly random 2 to 8 ms (mean 5 ms) before the emulator
// answers it, so that a fire delivering its targets one after another
// pays those latencies in sequence and a concurrent one overlaps them, as
// against DynamoDB.
func DefaultDynamoLatency(r *rand.Rand) time.Duration {
	return 2*time.Millisecond + time.Duration(r.Int64N(int64(6*time.Millisecond)))
}

// dynamoFront is the DynamoDB endpoint the functions reach: it holds each
// request for the modelled latency, forwards it to the in-process
// emulator, and records when each key of the target table was first
// written by a committed transaction (the row's apply time).
type dynamoFront struct {
	rp          http.Handler
	latency     func(*rand.Rand) time.Duration
	targetTable string
	// prune deletes each row's target item once its apply is recorded
	// (Config.PruneApplied).
	prune bool

	mu       sync.Mutex
	rng      *rand.Rand
	requests int
	byKey    map[string]int       // requests by the signer's access key
	applied  map[string]time.Time // target key -> first commit
	changed  chan struct{}        // closed and replaced at each new key
}

// newDynamoFront fronts upstream: the emulator's URL (a reverse proxy to
// it) or, in process, the emulator itself.
func newDynamoFront(upstream any, targetTable string, latency func(*rand.Rand) time.Duration, seed uint64) (*dynamoFront, error) {
	var h http.Handler
	switch u := upstream.(type) {
	case string:
		pu, err := url.Parse(u)
		if err != nil {
			return nil, err
		}
		h = httputil.NewSingleHostReverseProxy(pu)
	case http.Handler:
		h = u
	}
	return &dynamoFront{
		rp: h, latency: latency, targetTable: targetTable,
		rng: rand.New(rand.NewPCG(seed, 0x64796e)), byKey: map[string]int{}, applied: map[string]time.Time{}, changed: make(chan struct{}),
	}, nil
}

func (d *dynamoFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.requests++
	d.byKey[accessKey(r)]++
	hold := time.Duration(0)
	if d.latency != nil {
		hold = d.latency(d.rng)
	}
	d.mu.Unlock()
	time.Sleep(hold) // the request's latency, not synchronisation
	op := r.Header.Get("X-Amz-Target")
	if !strings.HasSuffix(op, ".TransactWriteItems") {
		d.rp.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	d.rp.ServeHTTP(rec, r)
	if rec.status == http.StatusOK {
		d.recordApplied(body)
	}
}

// deleteApplied deletes the target items of applied rows from the
// emulator, past the latency front: the relay never reads a row's target
// item back (only its rh record, which stays), and minidyn's cost per
// request grows with the table (it copies every table a transaction
// touches and matches a query's key condition against every item), which
// DynamoDB's does not. A benchmark that delivers thousands of rows would
// otherwise mostly measure the emulator's CPU.
func (d *dynamoFront) deleteApplied(keys [][2]string) {
	for _, pk := range keys {
		body, _ := json.Marshal(map[string]any{
			"TableName": d.targetTable,
			"Key":       map[string]map[string]string{dynamo.AttrPartition: {"S": pk[0]}, dynamo.AttrKey: {"S": pk[1]}},
		})
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		req.Header.Set("X-Amz-Target", "DynamoDB_20120810.DeleteItem")
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		d.rp.ServeHTTP(httptest.NewRecorder(), req)
	}
}

// requestsBy is how many requests the signer with access key made.
func (d *dynamoFront) requestsBy(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.byKey[key]
}

// accessKey is the access key of r's SigV4 signature
// ("AWS4-HMAC-SHA256 Credential=<key>/<date>/..."): each execution
// environment signs with its own, so its requests can be told apart.
func accessKey(r *http.Request) string {
	_, cred, _ := strings.Cut(r.Header.Get("Authorization"), "Credential=")
	key, _, _ := strings.Cut(cred, "/")
	return key
}

// recordApplied notes the target-table keys a committed transaction put,
// at the time it committed; with prune it first deletes the row items
// among them (not the engine's own records under
// relaycore.ReservedPrefix), so a waiter told of the apply finds them
// gone.
func (d *dynamoFront) recordApplied(body []byte) {
	var tx struct {
		TransactItems []struct {
			Put *struct {
				TableName string
				Item      map[string]struct{ S string }
			}
		}
	}
	if json.Unmarshal(body, &tx) != nil {
		return
	}
	now := time.Now()
	var keys []string
	var rows [][2]string
	for _, it := range tx.TransactItems {
		if it.Put == nil || it.Put.TableName != d.targetTable {
			continue
		}
		k := it.Put.Item[dynamo.AttrKey].S
		if k == "" {
			continue
		}
		keys = append(keys, k)
		if !strings.HasPrefix(k, relaycore.ReservedPrefix) {
			rows = append(rows, [2]string{it.Put.Item[dynamo.AttrPartition].S, k})
		}
	}
	if d.prune {
		d.deleteApplied(rows)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	fresh := false
	for _, k := range keys {
		if _, ok := d.applied[k]; !ok {
			d.applied[k] = now
			fresh = true
		}
	}
	if fresh {
		close(d.changed)
		d.changed = make(chan struct{})
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}
