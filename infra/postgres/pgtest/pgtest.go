// Package pgtest gives a package's tests one throwaway PostgreSQL cluster:
// initdb into a temporary directory, one postgres server listening only on
// a Unix socket in that directory, started on first use and stopped when
// the test binary's TestMain returns:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// The server refuses to run as root, so when the tests run as root (as CI
// does) initdb and postgres run as the "postgres" user that Debian's
// package creates, or as "nobody" when there is none, through
// SysProcAttr.Credential: no su or sudo is needed.
//
// The server is the test binary's own child (not daemonized by pg_ctl),
// started with Pdeathsig, so a test binary that panics or is killed takes
// its server down with it instead of leaving one behind. Durability
// settings are off (fsync, full_page_writes, synchronous_commit): the
// tests check the store's logic, not the disk's.
//
// Without PostgreSQL installed, the tests that need it skip with a message
// saying how to install it, unless RELAY_REQUIRE_POSTGRES=1 (CI sets it),
// when they fail.
package pgtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relay-dev/relay/infra/postgres/internal/session"
)

// RequireEnv names the environment variable that turns a missing
// PostgreSQL installation from a skip into a failure.
const RequireEnv = "RELAY_REQUIRE_POSTGRES"

// BinEnv names an environment variable holding the directory of initdb and
// postgres, searched before PATH and /usr/lib/postgresql/*/bin.
const BinEnv = "RELAY_POSTGRES_BIN"

// superuser is the cluster's superuser role, made by initdb -U.
const superuser = "relay"

// Cluster is one running server.
type Cluster struct {
	dir  string // temp dir: data/ and the socket
	bin  string
	cred *syscall.Credential
	env  []string
	cmd  *exec.Cmd
	// commits: synchronous_commit on, so a commit acknowledged survives
	// the server's crash (Private clusters, which Restart crashes; fsync
	// stays off: only the machine's crash would need it).
	commits bool
	// port is the server's port (its socket's name, and its TCP port
	// on 127.0.0.1 when tls is set).
	port int
	// tls: ssl=on with a certificate of tlsCA's, listening on 127.0.0.1
	// too (TLS clusters).
	tls     bool
	caFile  string
	exited  chan struct{}
	log     *logBuffer
	dbSeq   atomic.Int64
	mu      sync.Mutex
	pools   []*pgxpool.Pool
	version string
}

var (
	once       sync.Once
	shared     *Cluster
	startErr   error
	notPresent string // non-empty: why PostgreSQL is not available
)

// Main runs m and then stops the cluster, if a test started one. Use it
// from TestMain.
func Main(m *testing.M) int { return After(m.Run()) }

// After stops the cluster, if a test started one, and returns code, or 1
// if stopping failed: for a TestMain that runs its tests through another
// helper, as os.Exit(pgtest.After(servetest.Main(m, &bin))).
func After(code int) int {
	if shared != nil {
		if err := shared.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Get returns the shared cluster, starting it on first use. It skips tb
// when PostgreSQL is not installed (fails with RELAY_REQUIRE_POSTGRES=1),
// and fails it when the cluster could not start.
func Get(tb testing.TB) *Cluster {
	tb.Helper()
	once.Do(func() {
		bin, why := findBin()
		if why != "" {
			notPresent = why
			return
		}
		shared, startErr = start(bin, false)
	})
	if notPresent != "" {
		msg := fmt.Sprintf("PostgreSQL not installed (%s): apt-get install postgresql, or set %s to the directory of initdb and postgres", notPresent, BinEnv)
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("%s; %s=1 requires it", msg, RequireEnv)
		}
		tb.Skipf("%s; tests skipped (%s=1 makes this a failure)", msg, RequireEnv)
	}
	if startErr != nil {
		tb.Fatalf("pgtest: %v", startErr)
	}
	return shared
}

// NewDatabase creates an empty database on the shared cluster and returns
// its connection string (the cluster's superuser, over the Unix socket).
// The database is dropped when tb ends, after the cleanups registered
// after this call (pools on it close first).
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	c := Get(tb)
	name := fmt.Sprintf("t%d", c.dbSeq.Add(1))
	if err := c.admin("CREATE DATABASE " + name + " TEMPLATE template0"); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := c.admin("DROP DATABASE " + name + " WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return c.DSN(name)
}

// Pool connects to dsn with at most maxConns connections (0: 8) and closes
// the pool when tb ends. Its sessions have the server's defaults (not
// postgres.ConfigurePool's settings).
func Pool(tb testing.TB, dsn string, maxConns int) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	if maxConns <= 0 {
		maxConns = 8
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Admin runs one statement as the superuser on the postgres database
// (CREATE ROLE, GRANT): what tests of permissions need.
func Admin(tb testing.TB, sql string) {
	tb.Helper()
	if err := Get(tb).admin(sql); err != nil {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
}

func (c *Cluster) admin(sql string) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// SharedDatabase returns a pool on one database that every caller in the
// test binary shares (created on first use, closed by Main with the
// cluster). Tests that share it must keep to their own names (infra/postgres
// tests give each store a unique name). Its sessions have the store's
// settings (postgres.ConfigurePool), as relay serve's do; Pool's have the
// server's defaults.
func SharedDatabase(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	c := Get(tb)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pools) > 0 {
		return c.pools[0]
	}
	if err := c.admin("CREATE DATABASE shared TEMPLATE template0"); err != nil {
		tb.Fatalf("pgtest: create the shared database: %v", err)
	}
	pool, err := c.connect(context.Background(), "shared", 16, session.Configure)
	if err != nil {
		tb.Fatal(err)
	}
	c.pools = append(c.pools, pool)
	return pool
}

// DSN is the connection string of database db on the cluster, as the
// superuser.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", c.dir, c.port, superuser, db)
}

// Version is the server's version line (postgres --version).
func (c *Cluster) Version() string { return c.version }

// Log is what the server has written to its log so far.
func (c *Cluster) Log() string { return c.log.String() }

func (c *Cluster) connect(ctx context.Context, db string, maxConns int, configure ...func(*pgconn.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(c.DSN(db))
	if err != nil {
		return nil, err
	}
	for _, f := range configure {
		f(&cfg.ConnConfig.Config)
	}
	if maxConns <= 0 {
		maxConns = 8
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect to %s: %w", db, err)
	}
	return pool, nil
}

// findBin returns the directory holding initdb and postgres, or why there
// is none.
func findBin() (string, string) {
	has := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv(BinEnv); dir != "" {
		if has(dir) {
			return dir, ""
		}
		return "", fmt.Sprintf("%s=%s holds no initdb and postgres", BinEnv, dir)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		// /usr/local/bin may hold symlinks into the versioned directory.
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), ""
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), ""
		}
	}
	// Debian and Ubuntu keep them off PATH, one directory per major version.
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if has(d) {
			return d, ""
		}
	}
	return "", "no initdb and postgres in PATH or /usr/lib/postgresql/*/bin"
}

// runAs returns the credential to run the server with: none when not root,
// else the postgres user, else nobody.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, errors.New("running as root, and there is neither a postgres nor a nobody user to run the server as (useradd postgres)")
}

func start(bin string, commits bool) (*Cluster, error) { return initCluster(bin, commits, true) }

// initCluster makes a cluster's data directory and, when launch is set,
// starts its server.
func initCluster(bin string, commits, launch bool) (*Cluster, error) {
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	// The socket path must stay under the kernel's 107 bytes, so the
	// directory is a short one in the system temp dir, not t.TempDir.
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, exited: make(chan struct{}), log: &logBuffer{}, commits: commits, port: 5432}
	fail := func(err error) (*Cluster, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	env := []string{"LC_ALL=C", "LANG=C", "PATH=" + os.Getenv("PATH"), "TZ=UTC"}
	if out, err := exec.Command(filepath.Join(bin, "postgres"), "--version").Output(); err == nil {
		c.version = strings.TrimSpace(string(out))
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", superuser, "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	initdb.Dir = dir
	initdb.Env = env
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb (%s) as uid %d: %v\n%s", bin, uidOf(cred), err, out))
	}
	c.bin, c.cred, c.env = bin, cred, env
	if !launch {
		return c, nil
	}
	if err := c.launch(); err != nil {
		return fail(err)
	}
	return c, nil
}

// launch starts the server on c's data directory and waits until it
// accepts connections.
func (c *Cluster) launch() error {
	dir, data, cred, env := c.dir, filepath.Join(c.dir, "data"), c.cred, c.env
	c.exited = make(chan struct{})
	syncCommit := "off"
	if c.commits {
		syncCommit = "on"
	}
	listen, tlsArgs := "", []string(nil)
	if c.tls {
		listen = "127.0.0.1"
		tlsArgs = []string{"-c", "ssl=on", "-c", "ssl_cert_file=" + filepath.Join(dir, "server.crt"),
			"-c", "ssl_key_file=" + filepath.Join(dir, "server.key")}
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), "-D", data,
		"-c", "listen_addresses="+listen,
		"-c", "unix_socket_directories="+dir,
		"-c", "port="+strconv.Itoa(c.port),
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "synchronous_commit="+syncCommit,
		"-c", "shared_buffers=32MB",
		"-c", "max_connections=200",
		"-c", "log_min_error_statement=panic",
	)
	cmd.Args = append(cmd.Args, tlsArgs...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = c.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	c.cmd = cmd
	exited := c.exited
	// The server says when it accepts connections; reading its log is the
	// readiness signal, so no polling.
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			c.log.WriteString(line + "\n")
			if !signalled && strings.Contains(line, "database system is ready to accept connections") {
				signalled = true
				close(ready)
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case <-ready:
		return nil
	case <-exited:
		return fmt.Errorf("postgres exited before accepting connections:\n%s", c.log.String())
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("postgres did not accept connections within 2 minutes:\n%s", c.log.String())
	}
}

// Private starts a cluster of tb's own, stopped when tb ends, for a test
// that restarts the server (the shared cluster serves the other tests
// meanwhile). Its commits are synchronous, so what it acknowledged
// survives Restart's crash. It skips or fails tb as Get does.
func Private(tb testing.TB) *Cluster {
	tb.Helper()
	Get(tb) // the installation check, and its skip message
	bin, _ := findBin()
	c, err := start(bin, true)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := c.stop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return c
}

// Restart stops the server as a crash would (SIGQUIT: immediate shutdown,
// every connection cut, crash recovery at the next start) and starts it
// again on the same data directory, returning once it accepts
// connections. Pools on it see their connections fail and reconnect.
func (c *Cluster) Restart(tb testing.TB) {
	tb.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGQUIT)
	<-c.exited
	if err := c.launch(); err != nil {
		tb.Fatalf("pgtest: restart: %v", err)
	}
}

// NewDatabase creates an empty database on c and returns its connection
// string, as the package's NewDatabase does on the shared cluster.
func (c *Cluster) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d", c.dbSeq.Add(1))
	if err := c.admin("CREATE DATABASE " + name + " TEMPLATE template0"); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	return c.DSN(name)
}

// stop closes the shared pools and shuts the server down (fast shutdown:
// SIGINT), then removes its directory.
func (c *Cluster) stop() error {
	c.mu.Lock()
	for _, p := range c.pools {
		p.Close()
	}
	c.mu.Unlock()
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
	case <-time.After(time.Minute):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	return os.RemoveAll(c.dir)
}

func uidOf(c *syscall.Credential) int {
	if c == nil {
		return os.Geteuid()
	}
	return int(c.Uid)
}

// logBuffer collects the server's output for error messages.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.WriteString(s)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
