package relayserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/relaycore"
)

// Timeouts of the database stores' own calls (not the API's).
const (
	// storeOpenTimeout bounds connecting, checking and migrating at start
	// and in --check-config: a database that does not answer is an error
	// the operator sees, not a start that hangs.
	storeOpenTimeout = 30 * time.Second
	// pingTimeout bounds one readiness ping; pingEvery is how long its
	// answer serves /readyz, so probes (unauthenticated) cost the
	// database at most one query a second however often they come.
	pingTimeout = 5 * time.Second
	pingEvery   = time.Second
	// cancelDeadlineDelay is how long a query whose context ended may
	// wait for the server to act on the cancel request before the socket
	// is cut (pgconn.CancelRequestContextWatcherHandler).
	cancelDeadlineDelay = 5 * time.Second
)

// BackupNotSupported is the error code GET /v1/admin/backup answers (501)
// on a database store: the database's own backups are the backup.
const BackupNotSupported = "not_supported"

// openConfiguredStore opens the store cfg names.
func openConfiguredStore(ctx context.Context, cfg Config, log *slog.Logger) (*store, error) {
	switch cfg.Store.Type {
	case StorePostgres:
		return openPostgresStore(ctx, cfg.Store.Postgres)
	case StoreDynamoDB:
		return openDynamoStore(ctx, cfg.Store.DynamoDB)
	}
	return openBoltStores(cfg, log)
}

// CheckStore connects to the database cfg names and checks, without
// writing anything, that the server could run on it: on PostgreSQL the
// schema is one this release knows and the role has its privileges
// (postgres.Verify), on DynamoDB both tables exist with the relay's
// layout (or create_tables is on) and can be read. `relay serve
// --check-config` runs it after LoadAndCheck; on bbolt there is nothing
// more to check than Check did. notes says what the start will do that
// the check could not (a table create_tables will create).
func CheckStore(ctx context.Context, cfg Config) (notes []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, storeOpenTimeout)
	defer cancel()
	switch cfg.Store.Type {
	case StorePostgres:
		pool, where, err := postgresPool(ctx, cfg.Store.Postgres)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		if err := postgres.Verify(ctx, pool); err != nil {
			return nil, postgresOpenError(where, err)
		}
	case StoreDynamoDB:
		d := cfg.Store.DynamoDB
		client, err := dynamoClient(ctx, d)
		if err != nil {
			return nil, err
		}
		for _, table := range []string{d.SourceTable, d.TargetTable} {
			err := checkDynamoTable(ctx, client, d, table)
			if errors.As(err, new(*types.ResourceNotFoundException)) && d.CreateTables {
				notes = append(notes, fmt.Sprintf("store.dynamodb: table %s does not exist yet; the start creates it (create_tables)", table))
				continue
			}
			if err != nil {
				return nil, err
			}
			// A read of a key no batch writes proves the credentials may
			// read the table; writes cannot be proven without writing.
			if _, _, err := dynamo.New(client, table, dynamo.Options{}).Get(ctx, pingPartition, pingKey); err != nil {
				return nil, fmt.Errorf("store.dynamodb: read table %s: %w", table, err)
			}
		}
	}
	return notes, nil
}

// pingPartition and pingKey name an item no batch writes (no source or
// target id may start with relaycore.ReservedPrefix): the DynamoDB
// readiness ping and --check-config read it.
const (
	pingPartition relaycore.Partition = "_relay/ping"
	pingKey       string              = "ping"
)

// postgresPool builds the pool the configuration describes: max_conns,
// the statement timeout as a session default, the store's session
// settings (postgres.ConfigurePool; the DSN's own win), and cancelled contexts
// turned into cancel requests, so a request or fire that gives up stops
// its query on the server too, rather than only cutting the socket while
// the server finishes and commits it (docs/postgres.md). It connects
// lazily. where names the database for errors.
func postgresPool(ctx context.Context, p Postgres) (pool *pgxpool.Pool, where string, err error) {
	pc, err := pgxpool.ParseConfig(p.DSN)
	if err != nil {
		return nil, "", fmt.Errorf("store.postgres.dsn: %w", err)
	}
	where = postgresTarget(&pc.ConnConfig.Config)
	pc.MaxConns = int32(p.MaxConns)
	rp := pc.ConnConfig.RuntimeParams
	rp["statement_timeout"] = strconv.FormatInt(p.StatementTimeout.Milliseconds(), 10)
	if rp["application_name"] == "" {
		rp["application_name"] = "relay serve"
	}
	postgres.ConfigurePool(pc)
	pc.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelDeadlineDelay}
	}
	pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, "", fmt.Errorf("store.postgres (%s): %w", where, err)
	}
	return pool, where, nil
}

// postgresOpenError names the database in an error of checking or opening
// it, and says what a bare "context deadline exceeded" means there: the
// database accepted the connection and did not answer (a stalled network,
// a frozen server, a lock held on the schema) within storeOpenTimeout.
func postgresOpenError(where string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("store.postgres (%s): the database did not answer within %v (a stalled network, a server that hangs, or a lock held on the relay schema): %w", where, storeOpenTimeout, err)
	}
	return fmt.Errorf("store.postgres (%s): %w", where, err)
}

// postgresCallTimeout bounds each store call on the client
// (postgres.Options.CallTimeout): statement_timeout, which the server
// enforces, plus the time for a call's round trips and a pool wait, so a
// network that stalls fails a call (503, retry) instead of holding it
// until the request's end.
func postgresCallTimeout(p Postgres) time.Duration { return p.StatementTimeout + 2*time.Second }

// openPostgresStore connects, verifies (a newer schema or a role
// without its privileges is refused before anything is written), then
// opens the schema (creating or migrating it).
func openPostgresStore(ctx context.Context, p Postgres) (*store, error) {
	octx, cancel := context.WithTimeout(ctx, storeOpenTimeout)
	defer cancel()
	pool, where, err := postgresPool(octx, p)
	if err != nil {
		return nil, err
	}
	if err := postgres.Verify(octx, pool); err != nil {
		pool.Close()
		return nil, postgresOpenError(where, err)
	}
	db, err := postgres.Open(octx, pool, postgres.Options{CallTimeout: postgresCallTimeout(p)})
	if err != nil {
		pool.Close()
		return nil, postgresOpenError(where, err)
	}
	src := db.Store(SourceTable)
	s := &store{index: src,
		logAttrs:          []any{"store", StorePostgres, "database", where, "max_conns", p.MaxConns},
		lingerAfterCancel: cancelDeadlineDelay,
		backup: backupNotSupported("PostgreSQL: back it up with the database's own tools, pg_dump for a logical copy or " +
			"pg_basebackup with WAL archiving for point-in-time recovery (docs/postgres.md, Backup and restore)"),
		close: func() error { pool.Close(); return nil },
	}
	s.watch(src, db.Store(TargetTable), "PostgreSQL", db.Ping)
	return s, nil
}

// dynamoClient is a DynamoDB client on the SDK's default credential
// chain, with the configured region and endpoint.
func dynamoClient(ctx context.Context, d DynamoDB) (*dynamodb.Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if d.Region != "" {
		opts = append(opts, awsconfig.WithRegion(d.Region))
	}
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("store.dynamodb: AWS configuration: %w", err)
	}
	if ac.Region == "" {
		return nil, errors.New("store.dynamodb: no region: set store.dynamodb.region, or AWS_REGION in the server's environment")
	}
	return dynamodb.NewFromConfig(ac, func(o *dynamodb.Options) {
		if d.Endpoint != "" {
			o.BaseEndpoint = aws.String(d.Endpoint)
		}
		o.HTTPClient = awshttp.NewBuildableClient().WithTimeout(d.RequestTimeout)
	}), nil
}

// checkDynamoTable describes table and checks its layout.
func checkDynamoTable(ctx context.Context, client *dynamodb.Client, d DynamoDB, table string) error {
	err := dynamo.CheckTable(ctx, client, table, d.DueIndex == "gsi")
	if errors.As(err, new(*types.ResourceNotFoundException)) {
		return fmt.Errorf("store.dynamodb: table %s does not exist: create it with the relay's layout (docs/dynamodb.md), or set store.dynamodb.create_tables: %w", table, err)
	}
	if err != nil {
		return fmt.Errorf("store.dynamodb: %w", err)
	}
	return nil
}

// openDynamoStore checks (or creates) both tables and opens them.
func openDynamoStore(ctx context.Context, d DynamoDB) (*store, error) {
	octx, cancel := context.WithTimeout(ctx, storeOpenTimeout)
	defer cancel()
	client, err := dynamoClient(octx, d)
	if err != nil {
		return nil, err
	}
	for _, table := range []string{d.SourceTable, d.TargetTable} {
		var err error
		if d.CreateTables {
			if err = dynamo.CreateTable(octx, client, table); err != nil {
				err = fmt.Errorf("store.dynamodb: %w", err)
			}
		} else {
			err = checkDynamoTable(octx, client, d, table)
		}
		if err != nil {
			return nil, err
		}
	}
	opts := dynamo.Options{}
	if d.DueIndex == "scan" {
		opts.DueMode = dynamo.DueScan
	}
	src := dynamo.New(client, d.SourceTable, opts)
	s := &store{index: src,
		logAttrs: []any{"store", StoreDynamoDB, "source_table", d.SourceTable, "target_table", d.TargetTable, "region", client.Options().Region},
		backup: backupNotSupported("DynamoDB: back up both tables with DynamoDB's own backups, point-in-time recovery " +
			"(PITR) or on-demand backups (AWS Backup), and restore them together (docs/serve.md, Backup and restore)"),
		close: func() error { return nil },
	}
	ping := func(ctx context.Context) error {
		_, _, err := src.Get(ctx, pingPartition, pingKey)
		return err
	}
	s.watch(src, dynamo.New(client, d.TargetTable, opts), "DynamoDB", ping)
	return s, nil
}

// watch sets s's stores to src and dst, each wrapped to remember a
// failed commit, and its health to: the database answers a ping (at most
// one a second, see pingEvery), and neither store's latest commit failed.
func (s *store) watch(src, dst relaycore.Store, db string, ping func(context.Context) error) {
	ws, wt := &commitWatch{Store: src, name: "the source store"}, &commitWatch{Store: dst, name: "the target store"}
	s.source, s.target = ws, wt
	p := &pinger{ping: ping, every: pingEvery}
	s.health = func(ctx context.Context) error {
		if err := p.check(ctx); err != nil {
			if refusedByDatabase(err) {
				return fmt.Errorf("%s refuses the ping: %w", db, err)
			}
			return fmt.Errorf("%s does not answer: %w", db, err)
		}
		for _, w := range []*commitWatch{ws, wt} {
			if err := w.failed(); err != nil {
				return fmt.Errorf("%s: its last commit to %s failed: %w", db, w.name, err)
			}
		}
		return nil
	}
}

// refusedByDatabase reports whether err is the database's own answer (a
// table that is gone, access denied, a missing schema), not a silence:
// /readyz then says the database refuses, which the operator fixes there,
// rather than that it does not answer, which sends them to the network.
func refusedByDatabase(err error) bool {
	var api smithy.APIError
	var pg *pgconn.PgError
	return errors.As(err, &api) || errors.As(err, &pg)
}

// commitWatch remembers whether the latest Apply failed for a reason of
// the database's (not a false precondition, a batch the engine sized
// wrong, or a caller that gave up), so /readyz turns not ready while the
// database refuses writes, and ready at the next commit that succeeds,
// as a bbolt file whose commits fail does.
type commitWatch struct {
	relaycore.Store
	name string
	last atomic.Pointer[error]
}

var _ relaycore.BatchGetter = (*commitWatch)(nil)

func (w *commitWatch) Apply(ctx context.Context, p relaycore.Partition, b relaycore.Batch) error {
	err := w.Store.Apply(ctx, p, b)
	switch {
	case err == nil:
		w.last.Store(nil)
	case ctx.Err() != nil, errors.As(err, new(*relaycore.ConditionFailedError)),
		errors.Is(err, relaycore.ErrBatchTooLarge), errors.Is(err, relaycore.ErrValueTooLarge),
		errors.Is(err, relaycore.ErrInvalidBatch), refusedForItsData(err):
	default:
		w.last.Store(&err)
	}
	return err
}

// refusedForItsData reports whether the database refused the batch for
// what it writes, not for a fault of its own: on PostgreSQL a data
// exception, an integrity constraint or an error raised by a trigger or
// function (SQLSTATE classes 22, 23, P0: a rule of the operator's on one
// target's rows); on DynamoDB a ValidationException. The target's
// attempts fail and it is quarantined as for any refused batch, and the
// database stays ready for every other target: one poison target must not
// take a healthy replica out of its load balancer.
func refusedForItsData(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch class := pg.Code[:min(2, len(pg.Code))]; class {
		case "22", "23", "P0":
			return true
		}
		return false
	}
	var api smithy.APIError
	return errors.As(err, &api) && api.ErrorCode() == "ValidationException"
}

// GetMany keeps the store's one-round-trip reads (relaycore.GetMany does
// not look through wrappers).
func (w *commitWatch) GetMany(ctx context.Context, p relaycore.Partition, keys []string) (map[string][]byte, error) {
	return relaycore.GetMany(ctx, w.Store, p, keys)
}

// Unwrap gives relaycore the store beneath (its due index).
func (w *commitWatch) Unwrap() relaycore.Store { return w.Store }

func (w *commitWatch) failed() error {
	if e := w.last.Load(); e != nil {
		return *e
	}
	return nil
}

// pinger runs ping at most once per every, one at a time, and answers
// everyone who asks meanwhile with the latest result.
type pinger struct {
	ping  func(context.Context) error
	every time.Duration

	mu      sync.Mutex
	at      time.Time     // when the latest ping ended (zero: none yet)
	err     error         // its result
	running chan struct{} // closed when the ping in flight ends; nil when none
}

func (p *pinger) check(ctx context.Context) error {
	p.mu.Lock()
	if !p.at.IsZero() && time.Since(p.at) < p.every {
		err := p.err
		p.mu.Unlock()
		return err
	}
	if p.running == nil {
		done := make(chan struct{})
		p.running = done
		go func() {
			// Not the caller's context: a probe that hangs up must not
			// fail the ping everyone else waits for.
			pctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
			err := p.ping(pctx)
			cancel()
			p.mu.Lock()
			p.at, p.err, p.running = time.Now(), err, nil
			p.mu.Unlock()
			close(done)
		}()
	}
	running := p.running
	p.mu.Unlock()
	select {
	case <-running:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// backupNotSupported answers the backup route on a database store: 501
// with what to use instead. Only an authorised caller (operate and read)
// gets this far.
func backupNotSupported(instead string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotImplemented, BackupNotSupported,
			"GET /v1/admin/backup snapshots bbolt files, and this server's store is "+instead)
	})
}
