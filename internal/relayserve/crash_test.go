package relayserve_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/internal/relayserve"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// batch is one enqueue request of the load: its idempotency key, its rows
// and, once acknowledged, their seqs.
type batch struct {
	source string
	key    string
	rows   []api.RowJSON
	seqs   []uint64
}

// loadRow puts two keys at its target: its own ("row/<id>", proving it
// arrived) and "last/<source>", which holds the id of the source's row with
// the highest seq for that target once everything is delivered. A row
// applied twice, or out of order, would leave an older id there.
func loadRow(source, target, id string) api.RowJSON {
	v := base64.StdEncoding.EncodeToString([]byte(id))
	return api.RowJSON{Target: target, Puts: []api.PutJSON{{Key: "row/" + id, Value: &v}, {Key: "last/" + source, Value: &v}}}
}

// post sends one batch; ok reports an answer (acknowledged or refused),
// !ok a transport error: the outcome is unknown.
func post(c *http.Client, base, token string, b *batch) (status int, seqs []uint64, ok bool) {
	body, _ := json.Marshal(api.EnqueueRequest{Rows: b.rows})
	req, _ := http.NewRequest("POST", base+"/v1/sources/"+url.PathEscape(b.source)+"/rows", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", b.key)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, false
	}
	defer resp.Body.Close()
	var e api.EnqueueResponse
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		return resp.StatusCode, nil, resp.StatusCode != 200
	}
	return resp.StatusCode, e.Seqs, true
}

// kill -9 during a steady enqueue load loses no acknowledged row and
// applies none twice. Writers enqueue batches with idempotency keys until
// the server dies under them; after the restart every batch whose answer
// was lost is sent again with its key (committed once either way), the
// relay drains, and the target partitions are checked against every
// acknowledged seq.
func TestKill9UnderLoad(t *testing.T) {
	f := newFixture(t, "")
	kill9UnderLoad(t, f, 120, func() relaycore.Store { return openDB(t, f.db).Store(relayserve.TargetTable) })
}

// The same on PostgreSQL: relay serve killed, the database keeps what was
// acknowledged.
func TestKill9UnderLoadPostgres(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	f := newFixture(t, "")
	f.useStore(t, fmt.Sprintf("{type: postgres, postgres: {dsn: %q}}", dsn))
	kill9UnderLoad(t, f, 20, func() relaycore.Store {
		db, err := postgres.Open(t.Context(), pgtest.Pool(t, dsn, 2), postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return db.Store(relayserve.TargetTable)
	})
}

// And on DynamoDB (the in-process endpoint; the server reaches it through
// the SDK with credentials from its environment).
func TestKill9UnderLoadDynamoDB(t *testing.T) {
	ep := dynamotest.Start(t)
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "relay", "AWS_SECRET_ACCESS_KEY": "relay",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull} {
		t.Setenv(k, v)
	}
	f := newFixture(t, "")
	f.useStore(t, fmt.Sprintf("{type: dynamodb, dynamodb: {source_table: src, target_table: dst, region: us-east-1, endpoint: %q, create_tables: true, due_index: scan}}", ep.URL))
	kill9UnderLoad(t, f, 20, func() relaycore.Store {
		return dynamo.New(ep.Client(nil), "dst", dynamo.Options{DueMode: dynamo.DueScan})
	})
}

// useStore rewrites the fixture's configuration to run on store (a YAML
// flow mapping) instead of its bbolt file.
func (f *fixture) useStore(t *testing.T, store string) {
	t.Helper()
	b, err := os.ReadFile(f.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	dbLine := "db: " + f.db + "\n"
	if !strings.Contains(string(b), dbLine) {
		t.Fatalf("fixture configuration has no %q", dbLine)
	}
	if err := os.WriteFile(f.cfgPath, []byte(strings.Replace(string(b), dbLine, "store: "+store+"\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// kill9UnderLoad runs the load on f's server, kills it, restarts it and
// checks every acknowledged row in the target store target opens. The
// kill comes after killAfter acknowledged batches (the database stores
// take fewer: each of their commits costs more here than a bbolt one).
func kill9UnderLoad(t *testing.T, f *fixture, killAfter int, target func() relaycore.Store) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	p := f.start(t)
	c := f.client(t, p, "")
	token := f.tokens["producer"]

	const (
		writers      = 4
		rowsPerBatch = 10
		targets      = 8
	)
	sources := []string{"orders", "tenant/42"}
	var (
		mu      sync.Mutex
		acked   []*batch
		pending []*batch // sent, no answer: outcome unknown
		killNow = make(chan struct{})
		once    sync.Once
	)
	offsets := make([]uint64, writers)
	for i := range offsets {
		offsets[i] = rng.Uint64N(targets)
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := sources[w%len(sources)]
			for n := 0; ; n++ {
				b := &batch{source: src, key: fmt.Sprintf("w%d-b%d", w, n)}
				for i := range rowsPerBatch {
					tgt := fmt.Sprintf("t%d", (offsets[w]+uint64(n*rowsPerBatch+i))%targets)
					b.rows = append(b.rows, loadRow(src, tgt, fmt.Sprintf("w%d-%d-%d", w, n, i)))
				}
				status, seqs, ok := post(c, p.URL, token, b)
				mu.Lock()
				switch {
				case !ok:
					pending = append(pending, b)
					mu.Unlock()
					return // the server is gone
				case status != 200:
					mu.Unlock()
					t.Errorf("enqueue %s: status %d", b.key, status)
					return
				}
				b.seqs = seqs
				acked = append(acked, b)
				if len(acked) >= killAfter {
					once.Do(func() { close(killNow) })
				}
				mu.Unlock()
			}
		}()
	}
	<-killNow
	p.Kill(t)
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("killed after %d acknowledged batches; %d in flight", len(acked), len(pending))

	p = f.start(t)
	c = f.client(t, p, "")
	for _, b := range pending {
		status, seqs, ok := post(c, p.URL, token, b)
		if !ok || status != 200 {
			t.Fatalf("resend %s after restart: %d (answered %v)", b.key, status, ok)
		}
		b.seqs = seqs
		acked = append(acked, b)
	}
	maxSeq := map[string]uint64{}
	for _, b := range acked {
		for _, s := range b.seqs {
			maxSeq[b.source] = max(maxSeq[b.source], s)
		}
	}
	for _, src := range sources {
		waitDelivered(t, c, p.URL+"/v1/sources/"+url.PathEscape(src), f.tokens["reader"], maxSeq[src])
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	// Every acknowledged row is at its target, and each (source, target)
	// "last" key holds the row with the highest acknowledged seq.
	dst := target()
	ctx := context.Background()
	type key struct{ source, target string }
	type seqID struct {
		seq uint64
		id  string
	}
	last := map[key]seqID{}
	seen := map[string]uint64{} // seq -> row, per source: no seq is given twice
	rowsChecked := 0
	for _, b := range acked {
		if len(b.seqs) != len(b.rows) {
			t.Fatalf("batch %s: %d seqs for %d rows", b.key, len(b.seqs), len(b.rows))
		}
		for i, r := range b.rows {
			id := fmt.Sprintf("%s-%d", b.key, i)
			sk := fmt.Sprintf("%s/%d", b.source, b.seqs[i])
			if _, dup := seen[sk]; dup {
				t.Fatalf("seq %s acknowledged twice", sk)
			}
			seen[sk] = b.seqs[i]
			rowID, _ := base64.StdEncoding.DecodeString(*r.Puts[0].Value)
			v, ok, err := dst.Get(ctx, relaycore.Partition(r.Target), "row/"+string(rowID))
			if err != nil || !ok || string(v) != string(rowID) {
				t.Fatalf("acknowledged row %s (seq %s) missing at target %s: %q %v %v", id, sk, r.Target, v, ok, err)
			}
			rowsChecked++
			k := key{b.source, r.Target}
			if cur, ok := last[k]; !ok || b.seqs[i] > cur.seq {
				last[k] = seqID{b.seqs[i], string(rowID)}
			}
		}
	}
	keys := make([]key, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].source+keys[i].target < keys[j].source+keys[j].target })
	for _, k := range keys {
		v, ok, err := dst.Get(ctx, relaycore.Partition(k.target), "last/"+k.source)
		if err != nil || !ok || string(v) != last[k].id {
			t.Fatalf("target %s last/%s = %q (%v, %v); want %q, the row of seq %d", k.target, k.source, v, ok, err, last[k].id, last[k].seq)
		}
	}
	// Each target's watermark for a source covers the newest row it got
	// and no seq the source never gave.
	for _, k := range keys {
		wms, err := relaycore.TargetWatermarks(ctx, dst, relaycore.Partition(k.target))
		if err != nil {
			t.Fatal(err)
		}
		var through uint64
		for _, w := range wms {
			if string(w.Source) == k.source {
				through = w.Through
			}
		}
		if through < last[k].seq || through > maxSeq[k.source] {
			t.Fatalf("target %s: rh of %s is %d; want %d..%d", k.target, k.source, through, last[k].seq, maxSeq[k.source])
		}
	}
	t.Logf("%d acknowledged rows checked at %d (source, target) pairs", rowsChecked, len(keys))
}
