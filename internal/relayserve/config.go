package relayserve

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/lambda/event"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// Defaults of the configuration (docs/serve.md lists the same values).
const (
	DefaultListen            = "127.0.0.1:7480"
	DefaultMaxBodyBytes      = api.DefaultMaxBodyBytes
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxConnections    = 512
	DefaultAlarmWorkers      = 4
	DefaultSweepInterval     = time.Minute
	DefaultClaimTTL          = 10 * time.Second
	DefaultIdleTargetTTL     = 7 * 24 * time.Hour
	// DefaultAlarmLinger is alarms.linger: a source that keeps getting
	// rows fires at most a third of the time (infra/alarmclock,
	// Config.Linger).
	DefaultAlarmLinger  = 2.0
	DefaultDrainTimeout = 30 * time.Second
)

// Bounds of a custom budget. They are guard rails against typos, well
// above the paid plan: a fire's work is bounded by them, and so is the
// time a drain may have to wait for an in-flight fire.
const (
	MaxFiresPerAlarm  = 64
	MaxTargetsPerFire = 256
	MaxCallsPerTarget = 8
	MaxRowsPerFire    = 4096
)

// AnyProducer in roles.produce allows producing to every source.
const AnyProducer = "*"

// Config is the whole `relay serve` configuration (docs/serve.md). Field
// comments name the YAML key and its default.
type Config struct {
	// Listen (listen, default 127.0.0.1:7480) is the TCP address served;
	// port 0 picks a free port (the bound address is logged and written
	// to the ready file).
	Listen string `yaml:"listen"`
	// Store (store) says which database holds the outboxes and the
	// target partitions: bbolt files (the default), PostgreSQL or
	// DynamoDB.
	Store Store `yaml:"store"`
	// DB (db, required with store.type bbolt) is the bbolt file holding
	// the sources' outboxes (created if missing).
	DB string `yaml:"db"`
	// Targets (targets) says where rows are delivered.
	Targets Targets `yaml:"targets"`
	// Budget (budget) is the fires' work per alarm.
	Budget Budget `yaml:"budget"`
	// TLS (tls) turns on HTTPS; required unless listen is loopback.
	TLS TLS `yaml:"tls"`
	// Auth (auth) says how callers prove who they are.
	Auth Auth `yaml:"auth"`
	// Principals (principals) grants roles to named callers: the node id
	// of a client certificate or the name of a token.
	Principals map[string]Roles `yaml:"principals"`
	// Limits (limits) bounds what one client may cost the server.
	Limits Limits `yaml:"limits"`
	// Alarms (alarms) tunes the in-process alarm clock and sweeper.
	Alarms Alarms `yaml:"alarms"`
	// Takedowns (takedowns) configures the takedown owner.
	Takedowns Takedowns `yaml:"takedowns"`
	// DrainTimeout (drain_timeout, default 30s) bounds a graceful
	// shutdown: in-flight requests and fires get this long to finish.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// LogLevel (log_level, default info): debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
}

// Targets says where rows are delivered.
type Targets struct {
	// DB (targets.db, default: the same file as db) is the bbolt file
	// holding the target partitions. Another file keeps application reads
	// of the targets off the outbox's write lock.
	DB string `yaml:"db"`
}

// Store types (store.type).
const (
	StoreBbolt    = "bbolt"
	StorePostgres = "postgres"
	StoreDynamoDB = "dynamodb"
)

// Defaults of the database stores (docs/serve.md lists the same values).
const (
	DefaultPostgresMaxConns         = 8
	DefaultPostgresStatementTimeout = 30 * time.Second
	DefaultDynamoDBRequestTimeout   = 10 * time.Second
)

// Store selects and configures the database.
type Store struct {
	// Type (store.type, default bbolt): bbolt (the files db and
	// targets.db), postgres (store.postgres) or dynamodb
	// (store.dynamodb). Only the chosen type's block may be set.
	Type     string   `yaml:"type"`
	Postgres Postgres `yaml:"postgres"`
	DynamoDB DynamoDB `yaml:"dynamodb"`
}

// Postgres configures a PostgreSQL database (infra/postgres,
// docs/postgres.md).
type Postgres struct {
	// DSN (store.postgres.dsn, required) is the connection string, a
	// URL or key=value pairs as libpq takes them; TLS to the database is
	// its sslmode, sslrootcert, sslcert and sslkey (absolute paths). A
	// host other than a Unix socket or a loopback address needs sslmode
	// verify-full or verify-ca. A password is better in a passfile or
	// PGPASSWORD than here.
	DSN string `yaml:"dsn"`
	// MaxConns (store.postgres.max_conns, default 8) bounds the pool;
	// it overrides the DSN's pool_max_conns.
	MaxConns int `yaml:"max_conns"`
	// StatementTimeout (store.postgres.statement_timeout, default 30s)
	// is the server's statement_timeout for the relay's sessions: a
	// statement past it (a batch waiting on a lock) is cancelled by the
	// server, surely not applied. The client gives each store call 2 s
	// more (postgresCallTimeout), which ends calls the server cannot: a
	// stalled network.
	StatementTimeout time.Duration `yaml:"statement_timeout"`
}

// DynamoDB configures two DynamoDB tables (infra/dynamo,
// docs/dynamodb.md). Credentials come from the AWS SDK's default chain
// (environment, shared config and credentials files, SSO, the instance or
// task role), never from this file.
type DynamoDB struct {
	// SourceTable and TargetTable (store.dynamodb.source_table,
	// target_table, both required, different) are the tables of the
	// outboxes and of the target partitions, with the relay's layout.
	SourceTable string `yaml:"source_table"`
	TargetTable string `yaml:"target_table"`
	// Region (store.dynamodb.region, default: the SDK's, AWS_REGION or
	// the profile's).
	Region string `yaml:"region"`
	// Endpoint (store.dynamodb.endpoint, default AWS's for the region)
	// is another DynamoDB-API endpoint's URL (DynamoDB Local, a VPC
	// endpoint). http:// only to a loopback address.
	Endpoint string `yaml:"endpoint"`
	// CreateTables (store.dynamodb.create_tables, default false) creates
	// missing tables at start (on-demand billing, the due index).
	// Without it a missing table is an error.
	CreateTables bool `yaml:"create_tables"`
	// DueIndex (store.dynamodb.due_index, default gsi) is how the sweep
	// finds due alarms: gsi queries the tables' due index; scan reads the
	// whole source table, for endpoints whose secondary indexes are not
	// reliable (emulators).
	DueIndex string `yaml:"due_index"`
	// RequestTimeout (store.dynamodb.request_timeout, default 10s) bounds
	// each request to DynamoDB, its answer read whole: a network that
	// drops the answers (connections up, nothing arriving) would
	// otherwise hold a fire or the sweep until the connection closed,
	// which a black-holed TCP connection never does. A request past it is
	// treated as any lost answer: retried when that is safe, an
	// ambiguous write re-read.
	RequestTimeout time.Duration `yaml:"request_timeout"`
}

// Budget is a plan or a custom budget.
type Budget struct {
	// Plan (budget.plan, default free): free, paid or custom. The four
	// fields below are for custom only, and all required then.
	Plan           string `yaml:"plan"`
	FiresPerAlarm  int    `yaml:"fires_per_alarm"`
	TargetsPerFire int    `yaml:"targets_per_fire"`
	CallsPerTarget int    `yaml:"calls_per_target"`
	RowsPerFire    int    `yaml:"rows_per_fire"`
}

// TLS names PEM files. Cert and key turn HTTPS on (TLS 1.3 only);
// ClientCA turns on client certificate authentication.
type TLS struct {
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
	ClientCA string `yaml:"client_ca"`
}

// Auth configures authentication.
type Auth struct {
	// TokensFile (auth.tokens_file) holds hashed bearer tokens, one
	// "<principal> sha256:<hex>" per line (`relay serve token` mints one).
	TokensFile string `yaml:"tokens_file"`
	// Anonymous (auth.anonymous, default off) grants these roles to
	// requests without credentials; allowed only on a loopback listen.
	Anonymous *Roles `yaml:"anonymous"`
}

// Roles are what a principal may do.
type Roles struct {
	// Produce lists the sources the principal may enqueue to ("*": any).
	Produce []string `yaml:"produce"`
	// Read allows the read routes (delivered-through, watermark, state)
	// and /metrics.
	Read bool `yaml:"read"`
	// Operate allows the operator routes (targets, actions, archive).
	Operate bool `yaml:"operate"`
	// Hold makes the principal a node of the takedown owner: it reports
	// its own holdings, reads its own orders and posts its own receipts
	// (its name is its node id). docs/takedown.md.
	Hold bool `yaml:"hold"`
	// Takedown allows requesting takedowns, reading their status,
	// receipts and the holder index, and waiving a holder.
	Takedown bool `yaml:"takedown"`
}

// Limits bound the cost of one client.
type Limits struct {
	MaxBodyBytes      int           `yaml:"max_body_bytes"`
	MaxHeaderBytes    int           `yaml:"max_header_bytes"`
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	ReadTimeout       time.Duration `yaml:"read_timeout"`
	WriteTimeout      time.Duration `yaml:"write_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	MaxConnections    int           `yaml:"max_connections"`
}

// idleTargetTTL is alarms.idle_target_ttl as relaycore.RelayHandler
// takes it: 0 (never) is negative there, where 0 is the engine's default.
func (a Alarms) idleTargetTTL() time.Duration {
	if a.IdleTargetTTL == 0 {
		return -1
	}
	return a.IdleTargetTTL
}

// Alarms tunes the alarm clock.
type Alarms struct {
	Workers       int           `yaml:"workers"`
	SweepInterval time.Duration `yaml:"sweep_interval"`
	// ClaimTTL (alarms.claim_ttl, default 10s) is how long a fire's claim
	// on a source lasts (relaycore.RelayHandler.ClaimTTL). After a crash
	// the dead process's claims delay their sources' fires by up to this
	// long. Shorter than the engine's 30s default because the server runs
	// alone on its file (bbolt's lock) and never runs two alarms for a
	// source at once, so a claim only has to outlast one local fire.
	// Replicas on one database share claims, so it must outlast one fire
	// on any of them; it bounds how long a replica's death holds back
	// the sources it was firing (docs/serve.md, Replicas and failover).
	ClaimTTL time.Duration `yaml:"claim_ttl"`
	// IdleTargetTTL (alarms.idle_target_ttl, default 168h, 0s: never) is
	// how long a target with nothing pending or held must stay idle before
	// an alarm collects its figures (relaycore.RelayHandler.IdleTargetTTL),
	// so the store holds the figures of the targets in use rather than of
	// every target ever relayed to.
	IdleTargetTTL time.Duration `yaml:"idle_target_ttl"`
	// Linger (alarms.linger, default 0: off) holds a source's next fire
	// after a fire that delivered all it found while rows kept coming,
	// for Linger times that fire's duration (at most a second): each fire
	// then carries more rows, so extra workers or replicas on a saturated
	// database do not turn into more, smaller fires
	// (alarmclock.Config.Linger). Off by default: the last rows of a
	// burst wait for the hold, which costs short bursts more than the
	// bigger fires save them (docs/serve.md, Batching under load).
	Linger float64 `yaml:"linger"`
	// Replica (alarms.replica, default <hostname>-<pid>) names this
	// process among the replicas sharing one database: it seeds the
	// order in which the sweep fires what it found (so replicas sweeping
	// together start at different sources), and it is in the logs and
	// the relay_replica_info metric.
	Replica string `yaml:"replica"`
}

// maxReplicaLen bounds alarms.replica: a name for logs and a label.
const maxReplicaLen = 128

// maxLinger bounds alarms.linger: past a few fires' time the hold is
// latency with nothing more to gain (and alarmclock caps it at a second).
const maxLinger = 10

// Default returns the configuration with every default filled in (db is
// still required).
func Default() Config {
	return Config{
		Listen: DefaultListen,
		Store:  Store{Type: StoreBbolt, Postgres: defaultPostgres(), DynamoDB: defaultDynamoDB()},
		Budget: Budget{Plan: "free"},
		Limits: Limits{
			MaxBodyBytes: DefaultMaxBodyBytes, MaxHeaderBytes: DefaultMaxHeaderBytes,
			ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout,
			WriteTimeout: DefaultWriteTimeout, IdleTimeout: DefaultIdleTimeout,
			MaxConnections: DefaultMaxConnections,
		},
		Alarms:       Alarms{Workers: DefaultAlarmWorkers, SweepInterval: DefaultSweepInterval, ClaimTTL: DefaultClaimTTL, IdleTargetTTL: DefaultIdleTargetTTL},
		Takedowns:    Takedowns{Overdue: takedowns.DefaultOverdue, CloseAfter: takedowns.DefaultCloseAfter},
		DrainTimeout: DefaultDrainTimeout,
		LogLevel:     "info",
	}
}

func defaultPostgres() Postgres {
	return Postgres{MaxConns: DefaultPostgresMaxConns, StatementTimeout: DefaultPostgresStatementTimeout}
}

func defaultDynamoDB() DynamoDB {
	return DynamoDB{DueIndex: "gsi", RequestTimeout: DefaultDynamoDBRequestTimeout}
}

// ErrConfig is wrapped by every error Load and Parse return.
var ErrConfig = errors.New("invalid relay serve configuration")

// Load reads, decodes and validates the file at path. Relative paths in
// it (db, targets.db, tls.*, auth.tokens_file) are resolved against the
// file's directory, so a config works whatever directory the server
// starts in. Every problem found is reported, joined.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := parse(data, filepath.Dir(abs))
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// LoadAndCheck is Load then Check, with the problems of both in one
// report (what `relay serve --check-config` and the server's start run):
// the files the configuration names are loaded even when the document
// breaks rules, so one run shows a missing certificate along with a
// misspelt key. Only a file that cannot be read or parsed as YAML stops
// it early.
func LoadAndCheck(path string) (Config, error) {
	c, err := Load(path)
	var probs Problems
	if err != nil && !errors.As(err, &probs) {
		return c, err
	}
	if cerr := Check(c); cerr != nil {
		probs = append(probs, flatten(cerr)...)
	}
	if len(probs) > 0 {
		return c, fmt.Errorf("%s: %w", path, probs)
	}
	return c, nil
}

// Parse decodes and validates a configuration held in memory; relative
// paths stay relative to the working directory.
func Parse(data []byte) (Config, error) { return parse(data, "") }

func parse(data []byte, dir string) (Config, error) {
	c := Default()
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return c, fmt.Errorf("%w: %w", ErrConfig, err) // a syntax error: nothing else is meaningful
	}
	doc := lines{root: &root}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var errs Problems
	// An empty document (io.EOF) is all defaults, and then fails
	// validation: db is required.
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return c, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		// Unknown keys and values of the wrong type, each with its line;
		// the rest of the document was decoded and is validated too.
		duplicate := false
		for _, e := range te.Errors {
			errs = append(errs, doc.yamlProblem(e))
			duplicate = duplicate || strings.Contains(e, "already defined at line")
		}
		if duplicate {
			// A mapping with a repeated key is not decoded at all (yaml.v3),
			// so the rules would report its other keys as missing.
			return c, errs
		}
	}
	if dir != "" {
		for _, p := range []*string{&c.DB, &c.Targets.DB, &c.TLS.Cert, &c.TLS.Key, &c.TLS.ClientCA, &c.Auth.TokensFile, &c.Takedowns.CA} {
			if *p != "" && !filepath.IsAbs(*p) {
				*p = filepath.Join(dir, *p)
			}
		}
	}
	for _, e := range c.validate() {
		errs = append(errs, doc.locate(e))
	}
	slices.SortStableFunc(errs, func(a, b error) int { return cmp.Compare(lineNumber(a), lineNumber(b)) })
	if len(errs) > 0 {
		return c, errs
	}
	return c, nil
}

// validate returns every rule the configuration breaks.
func (c *Config) validate() []error {
	var errs []error
	bad := func(key []string, format string, args ...any) { errs = append(errs, keyErr(key, format, args...)) }
	at := func(keys ...string) []string { return keys }

	loopback := false
	if host, port, err := net.SplitHostPort(c.Listen); err != nil {
		bad(at("listen"), "listen %q: want host:port (%v)", c.Listen, err)
	} else if _, err := net.LookupPort("tcp", port); err != nil {
		// What net.Listen would refuse at start: a check that passes must
		// mean the server starts (ExecStartPre runs --check-config).
		bad(at("listen"), "listen %q: port %q: want a number from 0 to 65535 or a service name", c.Listen, port)
	} else {
		loopback = LoopbackHost(host)
	}
	errs = append(errs, c.validateStore()...)

	if _, err := c.RelayBudget(); err != nil {
		errs = append(errs, flatten(err)...)
	}

	tlsOn := c.TLS.Cert != "" || c.TLS.Key != ""
	switch {
	case (c.TLS.Cert == "") != (c.TLS.Key == ""):
		bad(at("tls"), "tls.cert and tls.key go together")
	case c.TLS.ClientCA != "" && !tlsOn:
		bad(at("tls", "client_ca"), "tls.client_ca needs tls.cert and tls.key: client certificates travel in the TLS handshake")
	case !tlsOn && !loopback && c.Listen != "":
		bad(at("listen"), "listen %q is not loopback: tls.cert and tls.key are required (tokens and rows must not cross a network in clear)", c.Listen)
	}
	if c.Auth.Anonymous != nil && !loopback {
		bad(at("auth", "anonymous"), "auth.anonymous is allowed only when listen is a loopback address, not %q", c.Listen)
	}
	if c.Auth.TokensFile == "" && c.TLS.ClientCA == "" && c.Auth.Anonymous == nil {
		bad(nil, "no way to authenticate: set auth.tokens_file, tls.client_ca, or (loopback only) auth.anonymous")
	}
	if c.Auth.Anonymous != nil {
		errs = append(errs, checkRoles(at("auth", "anonymous"), *c.Auth.Anonymous)...)
		if c.Auth.Anonymous.Hold {
			bad(at("auth", "anonymous", "hold"), "auth.anonymous.hold: a holder is a node, named by its credential; anonymous callers cannot be one")
		}
	}
	if c.Takedowns.Overdue < time.Minute || c.Takedowns.Overdue > 365*24*time.Hour {
		bad(at("takedowns", "overdue"), "takedowns.overdue %v: want 1m..8760h", c.Takedowns.Overdue)
	}
	if c.Takedowns.CloseAfter < time.Hour || c.Takedowns.CloseAfter > 10*365*24*time.Hour {
		bad(at("takedowns", "close_after"), "takedowns.close_after %v: want 1h..87600h", c.Takedowns.CloseAfter)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Principals)) {
		if err := checkPrincipalName(name); err != nil {
			bad(at("principals", name), "principals: %v", err)
		}
		if name == AnonymousPrincipal {
			bad(at("principals", name), "principals: the name %s is reserved for requests without credentials (auth.anonymous)", name)
		}
		errs = append(errs, checkRoles(at("principals", name), c.Principals[name])...)
		if c.Principals[name].Hold {
			if err := takedowns.CheckNode(name); err != nil {
				bad(at("principals", name, "hold"), "principals.%s.hold: a holder's name is its node id: %v", name, err)
			}
		}
	}

	l := c.Limits
	for _, f := range []struct {
		name   string
		v, min int
		max    int
	}{
		{"limits.max_body_bytes", l.MaxBodyBytes, 1024, 64 << 20},
		{"limits.max_header_bytes", l.MaxHeaderBytes, 4096, 1 << 20},
		{"limits.max_connections", l.MaxConnections, 1, 1 << 20},
		{"alarms.workers", c.Alarms.Workers, 1, 256},
	} {
		if f.v < f.min || f.v > f.max {
			bad(strings.Split(f.name, "."), "%s %d: want %d..%d", f.name, f.v, f.min, f.max)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"limits.read_header_timeout", l.ReadHeaderTimeout}, {"limits.read_timeout", l.ReadTimeout},
		{"limits.write_timeout", l.WriteTimeout}, {"limits.idle_timeout", l.IdleTimeout},
		{"alarms.sweep_interval", c.Alarms.SweepInterval}, {"drain_timeout", c.DrainTimeout},
	} {
		if f.v <= 0 {
			bad(strings.Split(f.name, "."), "%s %v: must be positive", f.name, f.v)
		}
	}
	if c.Alarms.SweepInterval > 0 && c.Alarms.SweepInterval < time.Second {
		bad(at("alarms", "sweep_interval"), "alarms.sweep_interval %v: at least 1s (each sweep scans the due index)", c.Alarms.SweepInterval)
	}
	if c.Alarms.ClaimTTL < time.Second || c.Alarms.ClaimTTL > 5*time.Minute {
		bad(at("alarms", "claim_ttl"), "alarms.claim_ttl %v: want 1s..5m", c.Alarms.ClaimTTL)
	}
	if t := c.Alarms.IdleTargetTTL; t != 0 && (t < time.Hour || t > 87600*time.Hour) {
		bad(at("alarms", "idle_target_ttl"), "alarms.idle_target_ttl %v: want 0s (never) or 1h..87600h", t)
	}
	if l := c.Alarms.Linger; !(l >= 0 && l <= maxLinger) {
		bad(at("alarms", "linger"), "alarms.linger %v: want 0 (fire a busy source again at once) to %d (times its last fire's duration)", l, maxLinger)
	}
	if r := c.Alarms.Replica; len(r) > maxReplicaLen || !utf8.ValidString(r) || strings.ContainsFunc(r, func(c rune) bool { return unicode.IsSpace(c) || unicode.IsControl(c) }) {
		bad(at("alarms", "replica"), "alarms.replica %q: want at most %d bytes of UTF-8 without spaces or control characters", r, maxReplicaLen)
	}
	if _, err := c.Level(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func checkRoles(key []string, r Roles) []error {
	where := strings.Join(key, ".")
	var errs []error
	for i, s := range r.Produce {
		if s == AnyProducer {
			continue
		}
		if _, err := event.Source("source", s); err != nil {
			errs = append(errs, keyErr(append(key[:len(key):len(key)], "produce"), "%s.produce[%d]: %v", where, i, err))
		}
	}
	return errs
}

// checkPrincipalName keeps names printable and short: they are recorded
// as the actor of operator actions (relaycore.MaxActorLen) and written in
// logs.
func checkPrincipalName(name string) error {
	if name == "" || len(name) > relaycore.MaxActorLen {
		return fmt.Errorf("name %q: want 1..%d characters", name, relaycore.MaxActorLen)
	}
	for _, r := range name {
		if r <= ' ' || r == 0x7f || r > 0x7e {
			return fmt.Errorf("name %q: printable ASCII without spaces only", name)
		}
	}
	return nil
}

// RelayBudget is the engine budget the configuration names.
func (c *Config) RelayBudget() (relaycore.RelayBudget, error) {
	b := c.Budget
	custom := b.FiresPerAlarm != 0 || b.TargetsPerFire != 0 || b.CallsPerTarget != 0 || b.RowsPerFire != 0
	switch strings.ToLower(b.Plan) {
	case "free", "paid":
		if custom {
			return relaycore.RelayBudget{}, keyErr([]string{"budget", "plan"}, "budget.plan %s takes no other budget fields: use plan custom to set them", b.Plan)
		}
		return relaycore.PlanBudget(b.Plan)
	case "custom":
		var errs []error
		for _, f := range []struct {
			name   string
			v, max int
		}{
			{"fires_per_alarm", b.FiresPerAlarm, MaxFiresPerAlarm},
			{"targets_per_fire", b.TargetsPerFire, MaxTargetsPerFire},
			{"calls_per_target", b.CallsPerTarget, MaxCallsPerTarget},
			{"rows_per_fire", b.RowsPerFire, MaxRowsPerFire},
		} {
			if f.v < 1 || f.v > f.max {
				errs = append(errs, keyErr([]string{"budget", f.name}, "budget.%s %d: want 1..%d with plan custom", f.name, f.v, f.max))
			}
		}
		if len(errs) > 0 {
			return relaycore.RelayBudget{}, errors.Join(errs...)
		}
		return relaycore.RelayBudget{FiresPerAlarm: b.FiresPerAlarm, TargetsPerFire: b.TargetsPerFire,
			CallsPerTarget: b.CallsPerTarget, RowsPerFire: b.RowsPerFire}, nil
	}
	return relaycore.RelayBudget{}, keyErr([]string{"budget", "plan"}, "budget.plan %q: want free, paid or custom", b.Plan)
}

// Level is the configured log level.
func (c *Config) Level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return l, keyErr([]string{"log_level"}, "log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	return l, nil
}

// LoopbackHost reports whether host (of a host:port) is a loopback name
// or address; "" (every interface) is not.
func LoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
