package postgres

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// TestStatementsProbeKeys: Apply's guarded write and GetMany read only the
// rows of the keys they name, however big the partition, on a table whose
// statistics are as stale as a new store's (never analyzed). With the
// preconditions as a LEFT JOIN and the deletes and GetMany as
// "key = ANY(...)", the planner read all 3000 rows of the partition for
// each; the count of rows read is what this asserts, from EXPLAIN ANALYZE.
func TestStatementsProbeKeys(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.NewDatabase(t), 1)
	ctx := t.Context()
	db, err := Open(ctx, pool, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := db.Store("plan")
	fillPartition(t, s)
	b := relaycore.Batch{
		Preconditions: []relaycore.Precondition{{Key: key(10), Value: []byte("v")}, {Key: "os", Absent: true}},
		Writes:        []relaycore.Write{{Key: "os", Value: []byte("1")}, {Key: key(20), Value: []byte("w"), Due: 7}},
	}
	for i := range 20 {
		b.Writes = append(b.Writes, relaycore.Write{Key: key(100 + 7*i), Delete: true})
	}
	keys := [][]byte{[]byte(key(5)), []byte(key(2999)), []byte("absent")}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	e := getParams()
	defer e.release()
	e.encodeApply(s.name, "big", b)
	for _, c := range []struct {
		name    string
		explain func(sql string) ([]byte, error)
		keys    int // keys the statement names
	}{
		// Apply's own encoding of its parameters, as it sends them.
		{"apply", func(sql string) ([]byte, error) {
			res := conn.Conn().PgConn().ExecParams(ctx, sql+applySQL, e.apply[:], applyParamOIDs, binaryFormat, nil).Read()
			if res.Err != nil || len(res.Rows) != 1 {
				return nil, fmt.Errorf("%d rows, %v", len(res.Rows), res.Err)
			}
			return res.Rows[0][0], nil
		}, len(b.Preconditions) + len(b.Writes)},
		{"getmany", func(sql string) (js []byte, err error) {
			return js, conn.QueryRow(ctx, sql+getManySQL, s.name, []byte("big"), keys).Scan(&js)
		}, len(keys)},
	} {
		var plan []struct{ Plan planNode }
		js, err := c.explain("EXPLAIN (ANALYZE, FORMAT JSON) ")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := json.Unmarshal(js, &plan); err != nil || len(plan) != 1 {
			t.Fatalf("%s: plan %s: %v", c.name, js, err)
		}
		checkRowsRead(t, c.name, plan[0].Plan, c.keys, js)
	}
}

// rows is how many keys fillPartition writes to partition "big".
const rows = 3000

// key is the test's key i in partition "big".
func key(i int) string { return fmt.Sprintf("r/%08d", i) }

// fillPartition writes rows keys to partition "big" of s, 250 a batch.
func fillPartition(t *testing.T, s *Store) {
	t.Helper()
	for i := 0; i < rows; i += 250 {
		var ws []relaycore.Write
		for j := i; j < i+250; j++ {
			ws = append(ws, relaycore.Write{Key: key(j), Value: []byte("v")})
		}
		if err := s.Apply(t.Context(), "big", relaycore.Batch{Writes: ws}); err != nil {
			t.Fatal(err)
		}
	}
}

// checkRowsRead fails t when plan read more than two rows of relay_items
// per key its statement names (a deleted key is read twice: probed, then
// deleted by its ctid), as a scan of the partition would.
func checkRowsRead(t *testing.T, what string, plan planNode, keys int, explained []byte) {
	t.Helper()
	if read := plan.rowsRead("relay_items"); read > 2*keys {
		t.Fatalf("%s read %d rows of relay_items for %d keys in a partition of %d; want at most two per key:\n%s", what, read, keys, rows, explained)
	}
}

// planNode is the part of EXPLAIN's JSON the test reads.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	ActualRows   float64    `json:"Actual Rows"`
	ActualLoops  float64    `json:"Actual Loops"`
	Filtered     float64    `json:"Rows Removed by Filter"`
	Plans        []planNode `json:"Plans"`
}

// rowsRead sums the rows that scans of rel returned or filtered out.
func (n planNode) rowsRead(rel string) int {
	total := 0
	if n.RelationName == rel && n.NodeType != "ModifyTable" {
		total += int((n.ActualRows + n.Filtered) * n.ActualLoops)
	}
	for _, c := range n.Plans {
		total += c.rowsRead(rel)
	}
	return total
}

// TestConfiguredSessionsPlanOnce: on sessions with ConfigurePool's
// settings every statement of the store runs a plan made once per
// connection (pg_prepared_statements counts no custom plan), and those
// plans, made on a new and empty table, still read only the rows of the
// keys they name once the partition holds 3000 rows (auto_explain's row
// counts, as in TestStatementsProbeKeys). Without enable_seqscan=off the
// guarded write's plan deleted by a sequential scan of the whole table;
// without plan_cache_mode the server planned it again for every call.
func TestConfiguredSessionsPlanOnce(t *testing.T) {
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one session: its settings, plans and notices
	ConfigurePool(cfg)
	var mu sync.Mutex
	var notices []string
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message)
		mu.Unlock()
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db, err := Open(ctx, pool, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := db.Store("plan")
	var os []byte
	// calls: a piece of each statement's text and the keys it names.
	type call struct {
		sql  string
		keys int
	}
	var calls []call
	exercise := func(round int) {
		t.Helper()
		calls = nil
		next := []byte(fmt.Sprint(round))
		b := relaycore.Batch{
			Preconditions: []relaycore.Precondition{{Key: "os", Value: os, Absent: os == nil}, {Key: key(10)}},
			// A put of a key the partition holds (from round 1): an
			// UPDATE by row address.
			Writes: []relaycore.Write{{Key: "os", Value: next}, {Key: key(20), Value: next}},
		}
		b.Preconditions[1].Absent = round == 0
		if round > 0 {
			b.Preconditions[1].Value = []byte("v")
		}
		for i := range 20 {
			b.Writes = append(b.Writes, relaycore.Write{Key: key(100 + 7*i + 1000*round), Delete: true})
		}
		if err := s.Apply(ctx, "big", b); err != nil {
			t.Fatalf("round %d: apply: %v", round, err)
		}
		os = next
		calls = append(calls, call{"WITH pc AS", len(b.Preconditions) + len(b.Writes)})
		keys := []string{key(5), key(2999), "absent"}
		if _, err := s.GetMany(ctx, "big", keys); err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call{"AS w(k)", len(keys)})
		if _, err := s.Scan(ctx, "big", relaycore.ScanRequest{Start: key(500), End: key(600), Limit: 10}); err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call{"ORDER BY key LIMIT", 11})
		if _, _, err := s.Get(ctx, "big", key(7)); err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call{"SELECT value FROM relay_items", 1})
		if _, err := s.Due(ctx, 1<<40, 10); err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call{"due IS NOT NULL", 0})
	}
	// Every statement runs first on the new, empty table: its plan is
	// made now.
	exercise(0)
	fillPartition(t, s)
	for _, sql := range []string{`LOAD 'auto_explain'`, `SET auto_explain.log_min_duration = 0`, `SET auto_explain.log_analyze = on`,
		`SET auto_explain.log_format = json`, `SET auto_explain.log_level = notice`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	mu.Lock()
	notices = nil
	mu.Unlock()
	exercise(1)
	if _, err := pool.Exec(ctx, `SET auto_explain.log_min_duration = -1`); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	logged := notices
	mu.Unlock()
	for _, c := range calls {
		found := false
		for _, n := range logged {
			i := strings.Index(n, "{")
			if i < 0 || !strings.Contains(n, c.sql) {
				continue
			}
			var explained struct{ Plan planNode }
			if err := json.Unmarshal([]byte(n[i:]), &explained); err != nil {
				t.Fatalf("auto_explain: %v:\n%s", err, n)
			}
			found = true
			checkRowsRead(t, fmt.Sprintf("%.40q", c.sql), explained.Plan, c.keys, []byte(n[i:]))
		}
		if !found {
			t.Fatalf("no plan logged for %.40q", c.sql)
		}
	}
	var custom int
	var stmts []string
	r, err := pool.Query(ctx, `SELECT statement, custom_plans FROM pg_prepared_statements WHERE statement LIKE '%relay_items%'`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var sql string
		var n int
		if err := r.Scan(&sql, &n); err != nil {
			t.Fatal(err)
		}
		custom += n
		stmts = append(stmts, sql)
	}
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	if len(stmts) < 5 || custom != 0 {
		t.Fatalf("%d custom plans of %d prepared statements on relay_items; want none of at least 5", custom, len(stmts))
	}
}

// ConfigurePool adds its settings and keeps what the connection string
// sets itself.
func TestConfigurePoolKeepsTheDSNs(t *testing.T) {
	cfg, err := pgxpool.ParseConfig("host=/tmp dbname=relay plan_cache_mode=auto statement_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	ConfigurePool(cfg)
	rp := cfg.ConnConfig.RuntimeParams
	if rp["plan_cache_mode"] != "auto" || rp["enable_seqscan"] != "off" || rp["statement_timeout"] != "5000" {
		t.Fatalf("runtime params %v: want the DSN's plan_cache_mode and statement_timeout, and enable_seqscan off", rp)
	}
}
