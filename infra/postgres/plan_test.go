package postgres

import (
	"encoding/json"
	"fmt"
	"testing"

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
	const rows = 3000
	key := func(i int) string { return fmt.Sprintf("r/%08d", i) }
	for i := 0; i < rows; i += 250 {
		var ws []relaycore.Write
		for j := i; j < i+250; j++ {
			ws = append(ws, relaycore.Write{Key: key(j), Value: []byte("v")})
		}
		if err := s.Apply(ctx, "big", relaycore.Batch{Writes: ws}); err != nil {
			t.Fatal(err)
		}
	}
	b := relaycore.Batch{
		Preconditions: []relaycore.Precondition{{Key: key(10), Value: []byte("v")}, {Key: "os", Absent: true}},
		Writes:        []relaycore.Write{{Key: "os", Value: []byte("1")}},
	}
	for i := range 20 {
		b.Writes = append(b.Writes, relaycore.Write{Key: key(100 + 7*i), Delete: true})
	}
	keys := [][]byte{[]byte(key(5)), []byte(key(2999)), []byte("absent")}
	for _, c := range []struct {
		name string
		sql  string
		args []any
		keys int // keys the statement names
	}{
		{"apply", applySQL, s.applyArgs("big", b), len(b.Preconditions) + len(b.Writes)},
		{"getmany", getManySQL, []any{s.name, []byte("big"), keys}, len(keys)},
	} {
		var plan []struct{ Plan planNode }
		var js []byte
		if err := pool.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+c.sql, c.args...).Scan(&js); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := json.Unmarshal(js, &plan); err != nil || len(plan) != 1 {
			t.Fatalf("%s: plan %s: %v", c.name, js, err)
		}
		// A deleted key is read twice: probed, then deleted by its ctid.
		if read := plan[0].Plan.rowsRead("relay_items"); read > 2*c.keys {
			t.Fatalf("%s read %d rows of relay_items for %d keys in a partition of %d; want at most two per key:\n%s", c.name, read, c.keys, rows, js)
		}
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
