package relayserve

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// validateStore returns every rule the store configuration breaks: the
// chosen type's keys are checked, and every other type's keys must be
// absent, so a configuration never names a database it does not use.
func (c *Config) validateStore() []error {
	var errs []error
	bad := func(key []string, format string, args ...any) { errs = append(errs, keyErr(key, format, args...)) }
	at := func(keys ...string) []string { return keys }
	s := c.Store
	pgSet := s.Postgres != defaultPostgres()
	dynSet := s.DynamoDB != defaultDynamoDB()
	switch s.Type {
	case StoreBbolt:
		if c.DB == "" {
			bad(nil, "db is required: the bbolt file of the relay (or set store.type to postgres or dynamodb)")
		}
		if c.Targets.DB != "" && c.Targets.DB == c.DB {
			bad(at("targets", "db"), "targets.db is the same file as db: leave it out to keep targets in the same file")
		}
		if pgSet {
			bad(at("store", "postgres"), "store.postgres is set but store.type is bbolt: set store.type: postgres to use it")
		}
		if dynSet {
			bad(at("store", "dynamodb"), "store.dynamodb is set but store.type is bbolt: set store.type: dynamodb to use it")
		}
		return errs
	case StorePostgres:
		errs = append(errs, s.Postgres.validate()...)
		if dynSet {
			bad(at("store", "dynamodb"), "store.dynamodb is set but store.type is postgres: remove it")
		}
	case StoreDynamoDB:
		errs = append(errs, s.DynamoDB.validate()...)
		if pgSet {
			bad(at("store", "postgres"), "store.postgres is set but store.type is dynamodb: remove it")
		}
	default:
		bad(at("store", "type"), "store.type %q: want bbolt, postgres or dynamodb", s.Type)
		return errs
	}
	// The bbolt keys would be silently unused: a configuration moved to a
	// database should say so by losing them.
	if c.DB != "" {
		bad(at("db"), "db is the bbolt file, unused with store.type %s (the data is in the database): remove it", s.Type)
	}
	if c.Targets.DB != "" {
		bad(at("targets", "db"), "targets.db is a bbolt file, unused with store.type %s: remove it", s.Type)
	}
	return errs
}

// Bounds of the PostgreSQL settings.
const (
	maxPostgresConns            = 1000
	maxPostgresStatementTimeout = time.Hour
	maxDynamoDBRequestTimeout   = 10 * time.Minute
)

func (p Postgres) validate() []error {
	var errs []error
	bad := func(key string, format string, args ...any) {
		errs = append(errs, keyErr(strings.Split("store.postgres."+key, "."), format, args...))
	}
	if p.MaxConns < 1 || p.MaxConns > maxPostgresConns {
		bad("max_conns", "store.postgres.max_conns %d: want 1..%d", p.MaxConns, maxPostgresConns)
	}
	if p.StatementTimeout < time.Millisecond || p.StatementTimeout > maxPostgresStatementTimeout {
		bad("statement_timeout", "store.postgres.statement_timeout %v: want 1ms..%v", p.StatementTimeout, maxPostgresStatementTimeout)
	}
	if p.DSN == "" {
		bad("dsn", "store.postgres.dsn is required: the database's connection string, like \"host=db.internal dbname=relay user=relay sslmode=verify-full sslrootcert=/etc/relay/db-ca.crt\"")
		return errs
	}
	// ParseConfig also reads the TLS files the DSN names, so a missing
	// sslrootcert is reported here, with the rest. Its errors redact a
	// password.
	pc, err := pgxpool.ParseConfig(p.DSN)
	if err != nil {
		bad("dsn", "store.postgres.dsn: %v", err)
		return errs
	}
	if err := checkPostgresTLS(pc); err != nil {
		bad("dsn", "store.postgres.dsn: %v", err)
	}
	return errs
}

// checkPostgresTLS refuses a connection that could reach a host beyond
// this machine without a verified TLS session: rows, and the password,
// must not cross a network in clear or to a server nobody checked (the
// rule listen has for the server's own port). pgx's default sslmode,
// prefer, tries TLS without verifying it and then falls back to plain.
func checkPostgresTLS(pc *pgxpool.Config) error {
	cc := pc.ConnConfig
	tries := []struct {
		host string
		tls  *tls.Config
	}{{cc.Host, cc.TLSConfig}}
	for _, f := range cc.Fallbacks {
		tries = append(tries, struct {
			host string
			tls  *tls.Config
		}{f.Host, f.TLSConfig})
	}
	for _, t := range tries {
		if strings.HasPrefix(t.host, "/") || LoopbackHost(t.host) {
			continue // a Unix socket, or this machine
		}
		if !verifiedTLS(t.tls) {
			return fmt.Errorf("host %s is not local, and the connection to it could be unencrypted or to an unverified server: use sslmode=verify-full with sslrootcert=<the server's CA, an absolute path>", t.host)
		}
	}
	return nil
}

// verifiedTLS reports whether c checks the server's certificate: pgx's
// verify-full (the standard check), or verify-ca (InsecureSkipVerify with
// its own chain check).
func verifiedTLS(c *tls.Config) bool {
	return c != nil && (!c.InsecureSkipVerify || c.VerifyPeerCertificate != nil)
}

// tableName is DynamoDB's rule for table names.
var tableName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{3,255}$`)

func (d DynamoDB) validate() []error {
	var errs []error
	bad := func(key string, format string, args ...any) {
		errs = append(errs, keyErr(strings.Split("store.dynamodb."+key, "."), format, args...))
	}
	for _, f := range []struct{ key, v string }{{"source_table", d.SourceTable}, {"target_table", d.TargetTable}} {
		switch {
		case f.v == "":
			bad(f.key, "store.dynamodb.%s is required: the table's name", f.key)
		case !tableName.MatchString(f.v):
			bad(f.key, "store.dynamodb.%s %q: a DynamoDB table name is 3..255 of a-z A-Z 0-9 _ - .", f.key, f.v)
		}
	}
	if d.SourceTable != "" && d.SourceTable == d.TargetTable {
		bad("target_table", "store.dynamodb.target_table is the same table as source_table: the relay needs two")
	}
	if d.Endpoint != "" {
		u, err := url.Parse(d.Endpoint)
		switch {
		case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
			bad("endpoint", "store.dynamodb.endpoint %q: want a URL, like https://dynamodb.eu-west-1.amazonaws.com", d.Endpoint)
		case u.Scheme == "http" && !LoopbackHost(u.Hostname()):
			bad("endpoint", "store.dynamodb.endpoint %q: http:// only to a loopback address (rows must not cross a network in clear): use https://", d.Endpoint)
		}
	}
	if d.DueIndex != "gsi" && d.DueIndex != "scan" {
		bad("due_index", "store.dynamodb.due_index %q: want gsi or scan", d.DueIndex)
	}
	if d.RequestTimeout < 100*time.Millisecond || d.RequestTimeout > maxDynamoDBRequestTimeout {
		bad("request_timeout", "store.dynamodb.request_timeout %v: want 100ms..%v", d.RequestTimeout, maxDynamoDBRequestTimeout)
	}
	return errs
}

// postgresTarget names the database a DSN connects to for the log and
// errors: host and database, never the password.
func postgresTarget(pc *pgconn.Config) string {
	return fmt.Sprintf("host=%s database=%s user=%s", pc.Host, pc.Database, pc.User)
}
