package relayserve

import (
	"strings"
	"testing"
	"time"
)

const anon = "listen: 127.0.0.1:7480\nauth: {anonymous: {read: true}}\n"

func TestParseStores(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		check      func(Config) bool
	}{
		{"bbolt by default", minimal, func(c Config) bool { return c.Store.Type == StoreBbolt && c.DB == "relay.db" }},
		{"bbolt named", anon + "db: r.db\nstore: {type: bbolt}\n", func(c Config) bool { return c.Store.Type == StoreBbolt }},
		{"postgres on a Unix socket", anon + "store:\n  type: postgres\n  postgres: {dsn: \"host=/run/postgresql dbname=relay\"}\n",
			func(c Config) bool {
				p := c.Store.Postgres
				return p.MaxConns == DefaultPostgresMaxConns && p.StatementTimeout == DefaultPostgresStatementTimeout
			}},
		{"postgres on loopback, tuned", anon + "store:\n  type: postgres\n  postgres: {dsn: \"postgres://relay@127.0.0.1/relay\", max_conns: 20, statement_timeout: 5s}\n",
			func(c Config) bool {
				return c.Store.Postgres.MaxConns == 20 && c.Store.Postgres.StatementTimeout == 5*time.Second
			}},
		{"postgres beyond this machine, verified", anon + "store:\n  type: postgres\n  postgres: {dsn: \"host=db.internal dbname=relay sslmode=verify-full\"}\n",
			func(c Config) bool { return true }},
		{"dynamodb", anon + "store:\n  type: dynamodb\n  dynamodb: {source_table: relay-source, target_table: relay-target, region: eu-west-1}\n",
			func(c Config) bool { d := c.Store.DynamoDB; return d.DueIndex == "gsi" && d.Region == "eu-west-1" }},
		{"dynamodb on a local endpoint", anon + "store:\n  type: dynamodb\n  dynamodb: {source_table: src, target_table: dst, endpoint: \"http://127.0.0.1:8000\", due_index: scan, create_tables: true}\n",
			func(c Config) bool { return c.Store.DynamoDB.CreateTables }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("parsed as %+v", c.Store)
			}
		})
	}
}

// Each store configuration is refused with a message naming the key and
// what to do; nothing is opened.
func TestParseRefusesStores(t *testing.T) {
	pg := func(block string) string { return anon + "store:\n  type: postgres\n  postgres: " + block + "\n" }
	dyn := func(block string) string { return anon + "store:\n  type: dynamodb\n  dynamodb: " + block + "\n" }
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown type", anon + "db: x\nstore: {type: sqlite}\n", []string{`line 4: store.type "sqlite": want bbolt, postgres or dynamodb`}},
		{"unknown key in the block", pg("{dsn: \"host=/tmp\", pool: 3}"), []string{`line 5: unknown key "pool"`}},
		{"unknown store key", anon + "store: {type: postgres, dsn: x}\n", []string{`unknown key "dsn"`}},
		{"no dsn", pg("{max_conns: 3}"), []string{"store.postgres.dsn is required"}},
		{"bad dsn", pg("{dsn: \"host=/tmp port=notaport\"}"), []string{"store.postgres.dsn: cannot parse"}},
		{"password redacted", pg("{dsn: \"postgres://relay:s3cret@127.0.0.1:notaport/relay\"}"), []string{"store.postgres.dsn"}},
		{"remote in clear", pg("{dsn: \"host=db.internal dbname=relay\"}"), []string{"host db.internal is not local", "sslmode=verify-full"}},
		{"remote unverified", pg("{dsn: \"host=db.internal dbname=relay sslmode=require\"}"), []string{"host db.internal is not local"}},
		{"remote fallback in clear", pg("{dsn: \"host=127.0.0.1,db.internal sslmode=disable\"}"), []string{"host db.internal is not local"}},
		{"missing CA file", pg("{dsn: \"host=db.internal sslmode=verify-full sslrootcert=/nonexistent/ca.crt\"}"), []string{"store.postgres.dsn", "/nonexistent/ca.crt"}},
		{"pool out of range", pg("{dsn: \"host=/tmp\", max_conns: 0}"), []string{"store.postgres.max_conns 0: want 1..1000"}},
		{"statement timeout", pg("{dsn: \"host=/tmp\", statement_timeout: 0s}"), []string{"store.postgres.statement_timeout 0s"}},
		{"db with postgres", "db: relay.db\n" + pg("{dsn: \"host=/tmp\"}"), []string{"line 1: db is the bbolt file, unused with store.type postgres"}},
		{"targets.db with dynamodb", "targets: {db: t.db}\n" + dyn("{source_table: aaa, target_table: bbb}"), []string{"targets.db is a bbolt file, unused with store.type dynamodb"}},
		{"postgres block with bbolt", minimal + "store: {postgres: {dsn: x}}\n", []string{"store.postgres is set but store.type is bbolt"}},
		{"dynamodb block with postgres", anon + "store: {type: postgres, postgres: {dsn: \"host=/tmp\"}, dynamodb: {source_table: aaa}}\n", []string{"store.dynamodb is set but store.type is postgres"}},
		{"no tables", dyn("{region: eu-west-1}"), []string{"store.dynamodb.source_table is required", "store.dynamodb.target_table is required"}},
		{"same table", dyn("{source_table: relay, target_table: relay}"), []string{"target_table is the same table as source_table"}},
		{"bad table name", dyn("{source_table: \"a b\", target_table: ok-table}"), []string{`store.dynamodb.source_table "a b"`}},
		{"endpoint in clear", dyn("{source_table: aaa, target_table: bbb, endpoint: \"http://dynamo.internal:8000\"}"), []string{"http:// only to a loopback address"}},
		{"endpoint not a URL", dyn("{source_table: aaa, target_table: bbb, endpoint: \"dynamo.internal\"}"), []string{"want a URL"}},
		{"due index", dyn("{source_table: aaa, target_table: bbb, due_index: table}"), []string{`store.dynamodb.due_index "table": want gsi or scan`}},
		{"request timeout", dyn("{source_table: aaa, target_table: bbb, request_timeout: 10ms}"), []string{`store.dynamodb.request_timeout 10ms: want 100ms..10m0s`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error shows the DSN's password:\n%v", err)
			}
		})
	}
}

// A store key is read at start only: a reload that finds it changed is
// refused, naming it.
func TestStoreKeysNeedRestart(t *testing.T) {
	a, err := Parse([]byte(anon + "store: {type: postgres, postgres: {dsn: \"host=/tmp\"}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	b := a
	b.Store.Postgres.MaxConns = 3
	if got := restartKeys(changedKeys(a, b)); len(got) != 1 || got[0] != "store.postgres.max_conns" {
		t.Fatalf("restart keys %v", got)
	}
}
