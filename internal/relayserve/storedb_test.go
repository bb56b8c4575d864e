package relayserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
	"github.com/relay-dev/relay/relaycore"
)

// dbConfig is a loopback, anonymous-everything server on the store block
// given (YAML flow mapping).
func dbConfig(t *testing.T, store string) Config {
	t.Helper()
	cfg, err := Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
auth: {anonymous: {produce: ["*"], read: true, operate: true}}
alarms: {sweep_interval: 1s, claim_ttl: 1s}
store: %s
`, store)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func pgStore(dsn string) string { return fmt.Sprintf("{type: postgres, postgres: {dsn: %q}}", dsn) }

// get answers GET url: status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls GET url until ok accepts the answer (a hang guard, not
// a timing assertion: the state it waits for comes as soon as it can).
func waitFor(t *testing.T, url string, what string, ok func(int, string) bool) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := get(t, url)
		if ok(code, body) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: still %d %s, waiting for %s", url, code, body, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitWatermark(t *testing.T, url, target string) {
	t.Helper()
	waitFor(t, url+"/v1/targets/"+target+"/watermarks", "orders delivered to "+target, func(code int, body string) bool {
		return code == 200 && strings.Contains(body, `"orders"`)
	})
}

// serveAndDeliver runs the server on cfg, enqueues a row and waits for its
// delivery through the API, checks the backup route's answer, and stops.
func serveAndDeliver(t *testing.T, cfg Config, backupSays string) {
	t.Helper()
	cancel, done, url, _ := runServer(t, cfg, nil)
	enqueueOne(t, url)
	waitWatermark(t, url, "t1")
	if code, body := get(t, url+"/readyz"); code != 200 {
		t.Fatalf("readyz %d %s", code, body)
	}
	code, body := get(t, url+PathBackup)
	if code != http.StatusNotImplemented || !strings.Contains(body, `"code":"`+BackupNotSupported+`"`) || !strings.Contains(body, backupSays) {
		t.Fatalf("backup: %d %s; want 501 %s naming %q", code, body, BackupNotSupported, backupSays)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestServeOnPostgres(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	serveAndDeliver(t, dbConfig(t, pgStore(dsn)), "pg_dump")
	pool := pgtest.Pool(t, dsn, 1)
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM relay_items WHERE store = 'target' AND part = 't1' AND key = 'k'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("delivered row in relay_items: %d, %v", n, err)
	}
}

// startRefused runs the server, which must refuse to start: the error is
// returned, and the same configuration fails --check-config (CheckStore)
// with it too.
func startRefused(t *testing.T, cfg Config) (start, check error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // a hang guard
	defer cancel()
	_, check = CheckStore(ctx, cfg)
	start = Run(ctx, cfg, Options{})
	if start == nil || check == nil {
		t.Fatalf("accepted: start %v, check %v", start, check)
	}
	t.Logf("start: %v\ncheck: %v", start, check)
	return start, check
}

// Bad input (issue 22's proof): a wrong DSN, a role without privileges,
// a schema from a newer release are refused at start and by
// --check-config, with a message saying what is wrong, and nothing is
// written.
func TestPostgresRefusedAtStart(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	admin := pgtest.Pool(t, dsn, 1)
	relayTables := func() string {
		var names string
		if err := admin.QueryRow(t.Context(), `SELECT coalesce(string_agg(relname, ',' ORDER BY relname), '') FROM pg_class WHERE relname LIKE 'relay_%' AND relkind = 'r'`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		return names
	}
	var roles atomic.Int64
	role := func(t *testing.T) string {
		name := fmt.Sprintf("relay_role_%d_%d", time.Now().UnixNano()%1e6, roles.Add(1))
		pgtest.Admin(t, "CREATE ROLE "+name+" LOGIN")
		return name
	}
	as := func(user string) string { return strings.Replace(dsn, "user=relay", "user="+user, 1) }
	both := func(t *testing.T, start, check error, want ...string) {
		t.Helper()
		for _, err := range []error{start, check} {
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
		}
	}

	t.Run("no such database", func(t *testing.T) {
		start, check := startRefused(t, dbConfig(t, pgStore(strings.Replace(dsn, "dbname=", "dbname=nope", 1))))
		both(t, start, check, "store.postgres", "does not exist")
	})
	t.Run("nothing listening", func(t *testing.T) {
		start, check := startRefused(t, dbConfig(t, pgStore("host=127.0.0.1 port=1 user=relay dbname=relay sslmode=disable")))
		both(t, start, check, "store.postgres (host=127.0.0.1 database=relay user=relay)", "connect")
	})
	t.Run("role without CREATE on a new database", func(t *testing.T) {
		start, check := startRefused(t, dbConfig(t, pgStore(as(role(t)))))
		both(t, start, check, "lacks CREATE on schema public")
		if !errors.Is(start, postgres.ErrPermission) {
			t.Errorf("start: %v, want ErrPermission", start)
		}
		if got := relayTables(); got != "" {
			t.Fatalf("tables written: %s", got)
		}
	})

	// The owner creates the schema once (a relay that starts as the
	// superuser); a role granted only SELECT may not run on it.
	serveAndDeliver(t, dbConfig(t, pgStore(dsn)), "pg_dump")
	countItems := func() int {
		var n int
		if err := admin.QueryRow(t.Context(), `SELECT count(*) FROM relay_items`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	items := countItems()

	t.Run("role that may only read", func(t *testing.T) {
		r := role(t)
		if _, err := admin.Exec(t.Context(), "GRANT SELECT ON relay_items, relay_schema TO "+r); err != nil {
			t.Fatal(err)
		}
		start, check := startRefused(t, dbConfig(t, pgStore(as(r))))
		both(t, start, check, "role "+r+" lacks INSERT on relay_items, UPDATE on relay_items, DELETE on relay_items")
	})
	t.Run("role with every privilege runs", func(t *testing.T) {
		r := role(t)
		if _, err := admin.Exec(t.Context(), "GRANT SELECT, INSERT, UPDATE, DELETE ON relay_items TO "+r+"; GRANT SELECT ON relay_schema TO "+r); err != nil {
			t.Fatal(err)
		}
		if _, err := CheckStore(t.Context(), dbConfig(t, pgStore(as(r)))); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("schema from a newer release", func(t *testing.T) {
		if _, err := admin.Exec(t.Context(), `INSERT INTO relay_schema (version, description) VALUES (99, 'from the future')`); err != nil {
			t.Fatal(err)
		}
		start, check := startRefused(t, dbConfig(t, pgStore(dsn)))
		both(t, start, check, "the database has schema version 99, this release knows up to 1")
		if !errors.Is(start, postgres.ErrSchemaTooNew) || !errors.Is(check, postgres.ErrSchemaTooNew) {
			t.Errorf("start %v, check %v: want ErrSchemaTooNew", start, check)
		}
	})
	if n := countItems(); n != items {
		t.Fatalf("relay_items: %d items, %d before the refused starts", n, items)
	}
}

// unixSocket is the socket path of a pgtest DSN (host=<dir> port=5432).
func unixSocket(t *testing.T, dsn string) string {
	t.Helper()
	c, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(c.Host, fmt.Sprintf(".s.PGSQL.%d", c.Port))
}

// readyzFollows checks /readyz through a database that goes away (the
// proxy cuts every connection and refuses new ones) and comes back.
func readyzFollows(t *testing.T, url string, p *faultProxy, db string, whileDown func()) {
	t.Helper()
	if code, body := get(t, url+"/readyz"); code != 200 {
		t.Fatalf("readyz %d %s", code, body)
	}
	p.cut()
	body := waitFor(t, url+"/readyz", "not ready", func(code int, _ string) bool { return code == http.StatusServiceUnavailable })
	if !strings.Contains(body, db+" does not answer") {
		t.Fatalf("readyz reason %s: want %q", body, db+" does not answer")
	}
	if whileDown != nil {
		whileDown()
	}
	p.restore()
	waitFor(t, url+"/readyz", "ready again", func(code int, _ string) bool { return code == 200 })
	// And it works again: a row enqueued now is delivered.
	enqueueOne(t, url)
}

func TestReadyzFollowsPostgres(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := newFaultProxy(t, "unix", unixSocket(t, dsn))
	c, _ := pgconn.ParseConfig(dsn)
	proxied := fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable", p.addr().Port, c.User, c.Database)
	cancel, done, url, logs := runServer(t, dbConfig(t, pgStore(proxied)), nil)
	readyzFollows(t, url, p, "PostgreSQL", func() {
		// The pool cannot connect: nothing was sent, surely not applied.
		outageAnswers(t, url, logs, "unavailable", "were not committed")
	})
	waitWatermark(t, url, "t1")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// outageAnswers checks what relay serve answers while its database is out
// of reach: an enqueue (with an Idempotency-Key) is 503 enqueueCode with
// Retry-After and a message saying what to do (hint), a read is 503
// unavailable with Retry-After, not 500 internal; the log has a WARN line.
func outageAnswers(t *testing.T, url string, logs *logLines, enqueueCode, hint string) {
	t.Helper()
	check := func(what string, resp *http.Response, code, hint string) {
		t.Helper()
		defer resp.Body.Close()
		var body struct {
			Error struct{ Code, Message string }
			Seqs  []uint64
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if resp.StatusCode != 503 || body.Error.Code != code || resp.Header.Get("Retry-After") == "" || !strings.Contains(body.Error.Message, hint) {
			t.Fatalf("%s while the database is out of reach: %d %s %q (Retry-After %q); want 503 %s with Retry-After, saying %q",
				what, resp.StatusCode, body.Error.Code, body.Error.Message, resp.Header.Get("Retry-After"), code, hint)
		}
		for _, s := range body.Seqs {
			if s != 0 {
				t.Fatalf("%s: seqs %v while nothing could commit", what, body.Seqs)
			}
		}
	}
	req, _ := http.NewRequest("POST", url+"/v1/sources/orders/rows", strings.NewReader(`{"rows":[{"target":"t9","puts":[{"key":"k","value":"dg=="}]}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "outage-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	check("enqueue", resp, enqueueCode, hint)
	resp, err = http.Get(url + "/v1/sources/orders/delivered-through?seq=1")
	if err != nil {
		t.Fatal(err)
	}
	check("delivered-through", resp, "unavailable", "nothing was changed")
	if m := logs.wait(t, "api: store unavailable"); m["level"] != "WARN" || m["code"] == nil {
		t.Fatalf("log line %v: want WARN with the code", m)
	}
}

// A request (or fire) that gives up cancels its query on the server
// (pgx's CancelRequestContextWatcherHandler): the server answers the
// query with query_canceled (57014). pgx's default handler only sets a
// deadline on the socket and the query runs on in the server (failing
// this test: the error is a timeout, not the server's).
func TestCancelledContextCancelsQuery(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool, _, err := postgresPool(t.Context(), Postgres{DSN: dsn, MaxConns: 2, StatementTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var timeout, app, plans, seqscan string
	if err := pool.QueryRow(t.Context(), `SELECT current_setting('statement_timeout'), current_setting('application_name'),
		current_setting('plan_cache_mode'), current_setting('enable_seqscan')`).Scan(&timeout, &app, &plans, &seqscan); err != nil ||
		timeout != "1min" || app != "relay serve" || plans != "force_generic_plan" || seqscan != "off" {
		t.Fatalf("statement_timeout %q, application_name %q, plan_cache_mode %q, enable_seqscan %q, %v; want 1min, relay serve, force_generic_plan, off (postgres.ConfigurePool)",
			timeout, app, plans, seqscan, err)
	}
	admin := pgtest.Pool(t, dsn, 1)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, `SELECT pg_sleep(120) /* cancel me */`)
		errc <- err
	}()
	waitActive(t, admin, 1)
	cancel()
	err = <-errc
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("cancelled query: %v; want the server's query_canceled (57014)", err)
	}
	waitActive(t, admin, 0)
}

// waitActive waits until n backends run the pg_sleep query.
func waitActive(t *testing.T, admin *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // a hang guard
	for {
		var got int
		if err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%/* cancel me */'`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends run the query, waiting for %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awsEnv gives the SDK's default chain static credentials and keeps it off
// the instance metadata service and the user's files.
func awsEnv(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "relay")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "relay")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
}

func dynStore(endpoint, extra string) string {
	return fmt.Sprintf("{type: dynamodb, dynamodb: {source_table: relay-source, target_table: relay-target, region: us-east-1, endpoint: %q, due_index: scan%s}}", endpoint, extra)
}

func TestServeOnDynamoDB(t *testing.T) {
	awsEnv(t)
	ep := dynamotest.Start(t)
	u, _ := url.Parse(ep.URL)
	p := newFaultProxy(t, "tcp", u.Host)
	cfg := dbConfig(t, dynStore(fmt.Sprintf("http://127.0.0.1:%d", p.addr().Port), ", create_tables: true"))
	notes, err := CheckStore(t.Context(), cfg)
	if err != nil {
		t.Fatalf("check-config before the tables exist, with create_tables: %v", err)
	}
	if len(notes) != 2 || !strings.Contains(notes[0], "table relay-source does not exist yet; the start creates it") {
		t.Fatalf("check-config notes %q: want both tables named as to be created", notes)
	}
	serveAndDeliver(t, cfg, "point-in-time recovery")
	cancel, done, url, logs := runServer(t, cfg, nil)
	readyzFollows(t, url, p, "DynamoDB", func() {
		// The enqueue's first read fails (retries exhausted): nothing
		// was sent.
		outageAnswers(t, url, logs, "unavailable", "were not committed")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A DynamoDB request whose answer never comes (a network that drops the
// answers, connections up) ends after store.dynamodb.request_timeout, so
// the sweep reports the outage and runs again, and delivery goes on once
// the network does; without a bound the sweep waited on the connection
// until it closed (a black-holed one never does), and /readyz, the log and
// relay_sweep_errors_total all said nothing.
func TestDynamoDBStallEndsRequests(t *testing.T) {
	awsEnv(t)
	ep := dynamotest.Start(t)
	u, _ := url.Parse(ep.URL)
	p := newFaultProxy(t, "tcp", u.Host)
	cfg := dbConfig(t, dynStore(fmt.Sprintf("http://127.0.0.1:%d", p.addr().Port), ", create_tables: true, request_timeout: 300ms"))
	cancel, done, url, logs := runServer(t, cfg, nil)
	enqueueOne(t, url)
	p.stall()
	logs.wait(t, "relay sweep failed")
	p.resume()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) { // a hang guard
		resp, err := http.Post(url+"/v1/sources/orders/rows", "application/json",
			strings.NewReader(`{"rows":[{"target":"t1","puts":[{"key":"k2","value":"dg=="}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("enqueue after the stall: %d", resp.StatusCode)
		}
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) { // a hang guard
		if _, body := get(t, url+"/v1/sources/orders/delivered-through?seq=2"); strings.Contains(body, `"delivered":true`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("seq 2 not delivered after the stall")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A database that answers the ping with a refusal (here: the table was
// deleted under the server) is said to refuse it, not to be silent.
func TestReadyzSaysTheDatabaseRefuses(t *testing.T) {
	awsEnv(t)
	ep := dynamotest.Start(t)
	cancel, done, url, _ := runServer(t, dbConfig(t, dynStore(ep.URL, ", create_tables: true")), nil)
	if _, err := ep.Client(nil).DeleteTable(t.Context(), &dynamodb.DeleteTableInput{TableName: aws.String("relay-source")}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) { // a hang guard
		code, body := get(t, url+"/readyz")
		if code == 503 {
			if !strings.Contains(body, "DynamoDB refuses the ping") || !strings.Contains(body, "ResourceNotFoundException") {
				t.Fatalf("readyz reason %s: want the refusal named", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("readyz stayed ready with the source table gone")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestDynamoDBRefusedAtStart(t *testing.T) {
	awsEnv(t)
	ep := dynamotest.Start(t)
	t.Run("missing tables", func(t *testing.T) {
		start, check := startRefused(t, dbConfig(t, dynStore(ep.URL, "")))
		for _, err := range []error{start, check} {
			if !strings.Contains(err.Error(), "table relay-source does not exist") || !strings.Contains(err.Error(), "create_tables") {
				t.Errorf("error %v: want the missing table and create_tables named", err)
			}
		}
	})
	t.Run("nothing listening", func(t *testing.T) {
		startRefused(t, dbConfig(t, dynStore("http://127.0.0.1:1", ", create_tables: true")))
	})
	t.Run("tables without the due index", func(t *testing.T) {
		client := ep.Client(nil)
		for _, table := range []string{"plain-source", "plain-target"} {
			in := dynamo.TableInput(table)
			in.GlobalSecondaryIndexes = nil
			in.AttributeDefinitions = in.AttributeDefinitions[:2]
			if _, err := client.CreateTable(t.Context(), in); err != nil {
				t.Fatal(err)
			}
		}
		cfg := dbConfig(t, strings.Replace(dynStore(ep.URL, ""), "due_index: scan", "due_index: gsi", 1))
		cfg.Store.DynamoDB.SourceTable, cfg.Store.DynamoDB.TargetTable = "plain-source", "plain-target"
		start, check := startRefused(t, cfg)
		for _, err := range []error{start, check} {
			if !strings.Contains(err.Error(), `table plain-source: no global secondary index "due"`) {
				t.Errorf("error %v: want the missing due index named", err)
			}
		}
		// The scan needs no index: the same tables are fine then.
		cfg.Store.DynamoDB.DueIndex = "scan"
		if _, err := CheckStore(t.Context(), cfg); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("no region", func(t *testing.T) {
		cfg := dbConfig(t, dynStore(ep.URL, ""))
		cfg.Store.DynamoDB.Region = ""
		start, check := startRefused(t, cfg)
		for _, err := range []error{start, check} {
			if !strings.Contains(err.Error(), "no region") {
				t.Errorf("error %v: want no region", err)
			}
		}
	})
}

// failingStore fails every Apply with err while it is set: the fault
// around a real store.
type failingStore struct {
	relaycore.Store
	err atomic.Pointer[error]
}

func (f *failingStore) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	if e := f.err.Load(); e != nil {
		return *e
	}
	return f.Store.Apply(ctx, p, b)
}

// A database store is not ready while its latest commit failed for a
// reason of the database's, and ready again at the next commit that
// succeeds; a false precondition or a caller that gave up is no fault of
// the database's.
func TestCommitWatch(t *testing.T) {
	f := &failingStore{Store: mem.New(mem.DefaultCapabilities)}
	w := &commitWatch{Store: f, name: "the target store"}
	put := relaycore.Batch{Writes: []relaycore.Write{{Key: "k", Value: []byte("v")}}}
	if err := w.Apply(t.Context(), "p", put); err != nil || w.failed() != nil {
		t.Fatalf("apply %v, failed %v", err, w.failed())
	}
	down := errors.New("connection refused")
	f.err.Store(&down)
	if err := w.Apply(t.Context(), "p", put); !errors.Is(err, down) || !errors.Is(w.failed(), down) {
		t.Fatalf("apply %v, failed %v; want %v", err, w.failed(), down)
	}
	f.err.Store(nil)
	guarded := relaycore.Batch{Preconditions: []relaycore.Precondition{{Key: "k", Absent: true}}, Writes: put.Writes}
	if err := w.Apply(t.Context(), "p", guarded); !errors.As(err, new(*relaycore.ConditionFailedError)) || w.failed() == nil {
		t.Fatalf("a false precondition: %v, failed %v; want it kept", err, w.failed())
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	f.err.Store(&down)
	_ = w.Apply(ctx, "p", put)
	f.err.Store(nil)
	if err := w.Apply(t.Context(), "p", put); err != nil || w.failed() != nil {
		t.Fatalf("a commit that succeeds: %v, failed %v; want cleared", err, w.failed())
	}
	f.err.Store(&down)
	_ = w.Apply(ctx, "p", put) // the caller gave up: not recorded
	if w.failed() != nil {
		t.Fatalf("a cancelled caller's error recorded: %v", w.failed())
	}
	f.err.Store(nil)
	_ = w.Apply(t.Context(), "p", put)
	for _, refused := range []error{
		fmt.Errorf("apply p: %w", &pgconn.PgError{Code: "P0001", Message: "audit: target p refuses writes"}),
		fmt.Errorf("apply p: %w", &pgconn.PgError{Code: "23514", Message: "check constraint"}),
		fmt.Errorf("apply p: %w", &smithy.GenericAPIError{Code: "ValidationException", Message: "item too large"}),
	} {
		f.err.Store(&refused)
		_ = w.Apply(t.Context(), "p", put)
		if w.failed() != nil {
			t.Fatalf("a batch refused for its data (%v) made the store not ready: %v", refused, w.failed())
		}
	}
	for _, fault := range []error{
		fmt.Errorf("apply p: %w", &pgconn.PgError{Code: "53100", Message: "disk full"}),
		fmt.Errorf("apply p: %w", &smithy.GenericAPIError{Code: "AccessDeniedException"}),
	} {
		f.err.Store(&fault)
		_ = w.Apply(t.Context(), "p", put)
		if w.failed() == nil {
			t.Fatalf("the database's own fault (%v) left the store ready", fault)
		}
	}
	f.err.Store(nil)
	if m, err := relaycore.GetMany(t.Context(), w, "p", []string{"k"}); err != nil || string(m["k"]) != "v" {
		t.Fatalf("GetMany through the watch: %v, %v", m, err)
	}
}

// A readiness probe flood costs the database one ping at a time and at
// most one per pingEvery.
func TestPingerSharesPings(t *testing.T) {
	var pings atomic.Int64
	release := make(chan struct{})
	p := &pinger{every: time.Hour, ping: func(context.Context) error { pings.Add(1); <-release; return nil }}
	errs := make(chan error, 10)
	for range 10 {
		go func() { errs <- p.check(t.Context()) }()
	}
	// Whether a check comes while the ping runs (it waits for it) or
	// after (it reads its answer), it sends none of its own.
	close(release)
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := p.check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := pings.Load(); n != 1 {
		t.Fatalf("%d pings for 11 checks within pingEvery, want 1", n)
	}
}

// A PostgreSQL server that crashes and restarts (pgtest's Restart: every
// connection cut) is recovered from by itself: /readyz is ready again
// with no restart of relay serve, and a row enqueued then is delivered.
func TestPostgresRestartRecovered(t *testing.T) {
	c := pgtest.Private(t)
	dsn := c.NewDatabase(t)
	cancel, done, url, _ := runServer(t, dbConfig(t, pgStore(dsn)), nil)
	enqueueOne(t, url)
	waitWatermark(t, url, "t1")
	c.Restart(t)
	waitFor(t, url+"/readyz", "ready after the database's restart", func(code int, _ string) bool { return code == 200 })
	resp, err := http.Post(url+"/v1/sources/orders/rows", "application/json",
		strings.NewReader(`{"rows":[{"target":"t2","puts":[{"key":"k","value":"dg=="}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		// The pool's first use of a connection the restart cut may fail
		// (surely not applied); the next one reconnects.
		t.Logf("first enqueue after the restart: %d", resp.StatusCode)
		enqueueTo(t, url, "t2")
	}
	waitWatermark(t, url, "t2")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func enqueueTo(t *testing.T, url, target string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/sources/orders/rows", "application/json",
		strings.NewReader(`{"rows":[{"target":"`+target+`","puts":[{"key":"k","value":"dg=="}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("enqueue to %s: %d", target, resp.StatusCode)
	}
}

// A stalled network between relay serve and PostgreSQL (connections up,
// nothing delivered: no statement_timeout on the server can end it) gets
// an enqueue and a read a 503 while it lasts, from the store's client-side
// call bound, instead of holding them until the client gives up; after
// the stall the enqueue retried with its key commits once.
func TestPostgresStallAnswers(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := newFaultProxy(t, "unix", unixSocket(t, dsn))
	c, _ := pgconn.ParseConfig(dsn)
	proxied := fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable", p.addr().Port, c.User, c.Database)
	// statement_timeout (30 s by default) outlasts write_timeout here:
	// the request's own deadline, less the time pgx's cancel request may
	// take, ends the call in time to write the 503.
	cfg := dbConfig(t, pgStore(proxied))
	cfg.Limits.WriteTimeout = 12 * time.Second
	cancel, done, url, logs := runServer(t, cfg, nil)
	enqueueOne(t, url)
	p.stall()
	outageAnswers(t, url, logs, "unavailable", "were not committed")
	p.resume()
	var seqs []uint64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) { // a hang guard
		req, _ := http.NewRequest("POST", url+"/v1/sources/orders/rows", strings.NewReader(`{"rows":[{"target":"t9","puts":[{"key":"k","value":"dg=="}]}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "outage-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Seqs []uint64 }
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			seqs = body.Seqs
			break
		}
		if resp.StatusCode != 503 || time.Now().After(deadline) {
			t.Fatalf("enqueue after the stall: %d", resp.StatusCode)
		}
	}
	if len(seqs) != 1 || seqs[0] != 2 {
		t.Fatalf("the retried enqueue got seqs %v, want [2] (the row before the stall is seq 1; nothing else committed)", seqs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A check or open that ran out of time says what that means, not only
// "context deadline exceeded".
func TestPostgresOpenErrorSaysTimeout(t *testing.T) {
	err := postgresOpenError("host=db", fmt.Errorf("verify: %w", context.DeadlineExceeded))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "the database did not answer within 30s") {
		t.Fatalf("%v", err)
	}
	if err := postgresOpenError("host=db", errors.New("28P01")); strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("%v", err)
	}
}
