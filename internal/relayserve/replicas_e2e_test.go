package relayserve_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// replicaSet is three `relay serve` processes on one PostgreSQL database,
// each restartable; writers find the current URL and client of each.
type replicaSet struct {
	f    *fixture
	cfgs []string

	mu      sync.Mutex
	procs   []*servetest.Proc
	clients []*http.Client
}

func (s *replicaSet) start(t testing.TB, i int) {
	t.Helper()
	p := servetest.Start(t, relayBin, s.cfgs[i])
	c := s.f.client(t, p, "")
	s.mu.Lock()
	s.procs[i], s.clients[i] = p, c
	s.mu.Unlock()
}

func (s *replicaSet) get(i int) (*servetest.Proc, *http.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[i], s.clients[i]
}

// newReplicaSet writes n configurations sharing the fixture's credentials
// and one database (store, a YAML flow mapping), alarms being their alarms settings ("key: value,"
// each), and starts them.
func newReplicaSet(t testing.TB, n int, store, alarms string) *replicaSet {
	t.Helper()
	f := newFixture(t, "")
	s := &replicaSet{f: f, procs: make([]*servetest.Proc, n), clients: make([]*http.Client, n)}
	for i := range n {
		cfg := fmt.Sprintf(`listen: 127.0.0.1:0
store: %s
tls:
  cert: %s
  key: %s
  client_ca: %s
auth:
  tokens_file: %s
alarms: {%s replica: r%d}
limits:
  max_body_bytes: 65536
drain_timeout: 20s
log_level: info
`, store, filepath.Join(f.pki, "server.crt"), filepath.Join(f.pki, "server.key"), filepath.Join(f.pki, "ca.crt"), filepath.Join(f.dir, "tokens"), alarms, i)
		s.cfgs = append(s.cfgs, servetest.WriteConfig(t, cfg+principalsYAML))
	}
	for i := range n {
		s.start(t, i)
	}
	return s
}

// Three replicas on one PostgreSQL database, four writers with idempotency
// keys sending each batch to the replicas in turn (the next one when a
// request fails, as a load balancer would), and under that load: kill -9
// of each replica in turn (restarted at once), and one crash of the
// database. Afterwards, read through the API: every acknowledged row is
// at its target, once in effect and in seq order per (source, target)
// (its last/<source> key holds the row of the highest acknowledged seq),
// and each target's watermark of each source equals the highest seq
// acknowledged for it.
func TestReplicasKilledInTurn(t *testing.T) {
	db := pgtest.Private(t)
	replicasKilledInTurn(t, pgStore(db.NewDatabase(t)), func() { db.Restart(t) })
}

// The same on DynamoDB (the in-process endpoint, reached through the SDK),
// without the database crash: the endpoint keeps its tables in memory.
func TestReplicasKilledInTurnDynamoDB(t *testing.T) {
	ep := dynamotest.Start(t)
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "relay", "AWS_SECRET_ACCESS_KEY": "relay",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull} {
		t.Setenv(k, v)
	}
	// One replica creates the tables first; the others find them.
	replicasKilledInTurn(t, fmt.Sprintf("{type: dynamodb, dynamodb: {source_table: src, target_table: dst, region: us-east-1, endpoint: %q, create_tables: true, due_index: scan}}", ep.URL), nil)
}

func pgStore(dsn string) string {
	return fmt.Sprintf("{type: postgres, postgres: {dsn: %q, max_conns: 4}}", dsn)
}

// replicasKilledInTurn runs the load and the kills on three replicas of
// store; restartDB, when set, crashes and restarts the database halfway.
func replicasKilledInTurn(t *testing.T, store string, restartDB func()) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	// linger as the README's replica example sets it: the kills and the
	// database crash meet held sources too.
	set := newReplicaSet(t, 3, store, "sweep_interval: 1s, claim_ttl: 2s, linger: 2,") // failover in seconds
	token := set.f.tokens["producer"]

	const (
		writers      = 4
		rowsPerBatch = 10
		targets      = 6
		perWriter    = 45 // batches
	)
	sources := []string{"orders", "tenant/42"}
	// Chaos after this many acknowledged batches: kill -9 and restart
	// replica 0, 1, crash the database, kill replica 2.
	steps := []int{25, 60, 95, 130}
	var (
		mu       sync.Mutex
		acked    []*batch
		refused  int
		progress = make(chan int, 1024)
	)
	offsets := make([]uint64, writers)
	for i := range offsets {
		offsets[i] = rng.Uint64N(targets)
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			src := sources[w%len(sources)]
			for n := range perWriter {
				b := &batch{source: src, key: fmt.Sprintf("w%d-b%d", w, n)}
				for i := range rowsPerBatch {
					tgt := fmt.Sprintf("t%d", (offsets[w]+uint64(n*rowsPerBatch+i))%targets)
					b.rows = append(b.rows, loadRow(src, tgt, fmt.Sprintf("w%d-%d-%d", w, n, i)))
				}
				for attempt := 0; ; attempt++ {
					p, c := set.get((w + n + attempt) % len(set.procs))
					status, seqs, ok := post(c, p.URL, token, b)
					if ok && status == 200 {
						b.seqs = seqs
						break
					}
					if ok && status != 503 && status != 500 {
						t.Errorf("enqueue %s: status %d", b.key, status)
						return
					}
					mu.Lock()
					refused++
					mu.Unlock()
					if attempt%len(set.procs) == len(set.procs)-1 {
						time.Sleep(50 * time.Millisecond) // a producer's back-off once every replica refused
					}
				}
				mu.Lock()
				acked = append(acked, b)
				progress <- len(acked)
				mu.Unlock()
			}
		})
	}
	var chaos []string
	for step, at := range steps {
		for n := range progress {
			if n >= at {
				break
			}
		}
		start := time.Now()
		if step == 2 {
			if restartDB == nil {
				continue
			}
			restartDB()
			chaos = append(chaos, fmt.Sprintf("database crashed and back in %v", time.Since(start).Round(time.Millisecond)))
			continue
		}
		i := min(step, 2) // replicas 0, 1, then (step 3) 2
		p, _ := set.get(i)
		p.Kill(t)
		set.start(t, i)
		chaos = append(chaos, fmt.Sprintf("r%d killed and ready again in %v", i, time.Since(start).Round(time.Millisecond)))
	}
	go func() {
		for range progress {
		}
	}()
	wg.Wait()
	close(progress)
	if t.Failed() {
		return
	}
	t.Logf("%d batches acknowledged, %d attempts refused or cut; %v", len(acked), refused, chaos)

	maxSeq := map[string]uint64{}
	for _, b := range acked {
		if len(b.seqs) != len(b.rows) {
			t.Fatalf("batch %s: %d seqs for %d rows", b.key, len(b.seqs), len(b.rows))
		}
		for _, s := range b.seqs {
			maxSeq[b.source] = max(maxSeq[b.source], s)
		}
	}
	p, c := set.get(0)
	for _, src := range sources {
		waitDelivered(t, c, p.URL+"/v1/sources/"+url.PathEscape(src), set.f.tokens["reader"], maxSeq[src])
	}

	// What each target holds, through the API (read role).
	reader := set.f.tokens["reader"]
	items := map[string]map[string]string{} // target -> key -> value
	for i := range targets {
		tgt := fmt.Sprintf("t%d", i)
		items[tgt] = map[string]string{}
		for after := ""; ; {
			r := do(t, c, "GET", fmt.Sprintf("%s/v1/targets/%s/items?limit=1000&after=%s", p.URL, tgt, url.QueryEscape(after)), reader, nil)
			if r.status != 200 {
				t.Fatalf("items of %s: %d %s", tgt, r.status, r.body)
			}
			var page api.TargetItemsResponse
			if err := json.Unmarshal(r.body, &page); err != nil {
				t.Fatal(err)
			}
			for _, it := range page.Items {
				v, _ := base64.StdEncoding.DecodeString(it.Value)
				items[tgt][it.Key] = string(v)
			}
			if after = page.Next; after == "" {
				break
			}
		}
	}
	type key struct{ source, target string }
	type seqID struct {
		seq uint64
		id  string
	}
	last := map[key]seqID{}
	seen := map[string]bool{}
	for _, b := range acked {
		for i, r := range b.rows {
			sk := fmt.Sprintf("%s/%d", b.source, b.seqs[i])
			if seen[sk] {
				t.Fatalf("seq %s acknowledged twice", sk)
			}
			seen[sk] = true
			id, _ := base64.StdEncoding.DecodeString(*r.Puts[0].Value)
			if got := items[r.Target]["row/"+string(id)]; got != string(id) {
				t.Fatalf("acknowledged row %s (seq %s) missing at target %s: %q (seed %d)", id, sk, r.Target, got, seed)
			}
			k := key{b.source, r.Target}
			if cur, ok := last[k]; !ok || b.seqs[i] > cur.seq {
				last[k] = seqID{b.seqs[i], string(id)}
			}
		}
	}
	keys := make([]key, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int { return strings.Compare(a.source+"\x00"+a.target, b.source+"\x00"+b.target) })
	for _, k := range keys {
		if got := items[k.target]["last/"+k.source]; got != last[k].id {
			t.Fatalf("target %s last/%s = %q; want %q, the row of seq %d: applied twice or out of order (seed %d)", k.target, k.source, got, last[k].id, last[k].seq, seed)
		}
		r := do(t, c, "GET", fmt.Sprintf("%s/v1/targets/%s/watermarks", p.URL, k.target), reader, nil)
		var wm api.TargetWatermarksResponse
		if r.status != 200 || json.Unmarshal(r.body, &wm) != nil {
			t.Fatalf("watermarks of %s: %d %s", k.target, r.status, r.body)
		}
		i := slices.IndexFunc(wm.Watermarks, func(w relaycore.SourceWatermark) bool { return string(w.Source) == k.source })
		if i < 0 || wm.Watermarks[i].Through != last[k].seq {
			t.Fatalf("target %s: watermarks %+v; want %s through %d, its highest acknowledged seq there", k.target, wm.Watermarks, k.source, last[k].seq)
		}
	}

	for i := range set.procs {
		p, c := set.get(i)
		r := do(t, c, "GET", p.URL+"/metrics", reader, nil)
		if want := fmt.Sprintf("relay_replica_info{replica=\"r%d\"} 1\n", i); !strings.Contains(string(r.body), want) {
			t.Errorf("r%d's metrics lack %q", i, want)
		}
		t.Logf("r%d since its last start: %s", i, metricLines(string(r.body), "relay_alarms_total{", "relay_alarm_checks_total{", "relay_alarms_lingered_total"))
	}
	for i := range set.procs {
		p, _ := set.get(i)
		if code := p.Stop(t); code != 0 {
			t.Errorf("r%d exit code %d", i, code)
		}
	}
	t.Logf("%d acknowledged rows checked at %d (source, target) pairs", len(seen), len(keys))
}

// metricLines are the lines of a Prometheus text body that start with one
// of prefixes, joined.
func metricLines(body string, prefixes ...string) string {
	var out []string
	for line := range strings.Lines(body) {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				out = append(out, strings.TrimSpace(line))
			}
		}
	}
	return strings.Join(out, "; ")
}

// BenchmarkReplicaFailover: how long a replica's sources wait after it is
// killed. Three `relay serve` processes on one PostgreSQL database
// (pgtest, a cluster of its own), alarms.claim_ttl 5s and sweep_interval
// 5s; four producers enqueue 10-row batches to the two sources (two
// producers each) through replica 0 only, so its clock fires them; after
// 40 batches it gets SIGKILL while its fires run, and the producers go on
// through the other two. Measured: from the kill until every source is
// delivered through the last seq replica 0 acknowledged. The other
// replicas' enqueues send no kick while the dead claims look live, so
// what brings the sources back is a sweep finding them and, for a claimed
// one, its retry when the claim lapses: at most claim_ttl + sweep_interval
// (10 s). Each round restarts replica 0. Reported:
// the mean and the longest wait over the rounds, and the bound.
func BenchmarkReplicaFailover(b *testing.B) {
	const (
		producers, rowsPerBatch, killAfter = 4, 10, 40
		claimTTL, sweep                    = 5 * time.Second, 5 * time.Second
	)
	db := pgtest.Private(b)
	set := newReplicaSet(b, 3, pgStore(db.NewDatabase(b)), fmt.Sprintf("sweep_interval: %v, claim_ttl: %v,", sweep, claimTTL))
	token, reader := set.f.tokens["producer"], set.f.tokens["reader"]
	var total, longest time.Duration
	for round := range b.N {
		var (
			mu     sync.Mutex
			acked  int
			before = map[string]uint64{} // source -> last seq replica 0 acknowledged
			killed bool
			kill   = make(chan struct{})
			stop   = make(chan struct{})
		)
		var wg sync.WaitGroup
		for p := range producers {
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					b := &batch{source: []string{"orders", "tenant/42"}[p%2], key: fmt.Sprintf("r%d-p%d-b%d", round, p, n)}
					for i := range rowsPerBatch {
						b.rows = append(b.rows, loadRow(b.source, fmt.Sprintf("t%d", i%4), fmt.Sprintf("%s-%d", b.key, i)))
					}
					for attempt := 0; ; attempt++ {
						mu.Lock()
						i := 0
						if killed {
							i = 1 + (p+n+attempt)%2
						}
						mu.Unlock()
						pr, c := set.get(i)
						status, seqs, ok := post(c, pr.URL, token, b)
						if ok && status == 200 {
							mu.Lock()
							if i == 0 && !killed {
								before[b.source] = max(before[b.source], slices.Max(seqs))
								if acked++; acked == killAfter {
									close(kill)
								}
							}
							mu.Unlock()
							break
						}
						select {
						case <-stop:
							return
						default:
						}
					}
				}
			})
		}
		<-kill
		p0, _ := set.get(0)
		mu.Lock()
		p0.Kill(b)
		killed = true
		want := maps.Clone(before)
		mu.Unlock()
		start := time.Now()
		p1, c1 := set.get(1)
		for src, seq := range want {
			waitDelivered(b, c1, p1.URL+"/v1/sources/"+url.PathEscape(src), reader, seq)
		}
		d := time.Since(start)
		close(stop)
		wg.Wait()
		total += d
		longest = max(longest, d)
		set.start(b, 0)
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "failover-s")
	b.ReportMetric(longest.Seconds(), "longest-s")
	b.ReportMetric((claimTTL + sweep).Seconds(), "bound-s")
}
