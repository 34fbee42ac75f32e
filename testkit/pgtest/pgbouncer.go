package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/migrations"
)

// EnvRequirePgbouncer names the environment variable that turns a missing pgbouncer
// binary from a skip into a failure (CI sets it, having installed pgbouncer).
const EnvRequirePgbouncer = "PGTEST_REQUIRE_PGBOUNCER"

// PooledExecMode is the pgx query exec mode of the pools NewPooled opens, the setting
// idemflow documents for a pooler in transaction mode that keeps no prepared statements
// (pgbouncer before 1.21, or with max_prepared_statements = 0).
const PooledExecMode = pgx.QueryExecModeCacheDescribe

// ErrNoPgbouncer is returned by StartPgbouncer when no pgbouncer binary is found.
var ErrNoPgbouncer = errors.New("pgtest: no pgbouncer binary")

// Pgbouncer is a throwaway pgbouncer in transaction pooling mode in front of a Server:
// every database of the server is reachable through it, by name.
type Pgbouncer struct {
	// URL connects through the pooler to the server's default database, with no query
	// exec mode set (pgx's default).
	URL string

	port     int
	proc     *localServer
	stopOnce sync.Once
	stopErr  error
}

// StartPgbouncer starts pgbouncer (found through PATH or in /usr/sbin) in transaction
// pooling mode, listening on 127.0.0.1 on a free port, in front of srv, which must be a
// server on 127.0.0.1 that trusts local connections (a throwaway one). It runs as the
// `postgres` OS user when this process is root, since pgbouncer refuses to run as root.
// The error wraps ErrNoPgbouncer when there is no binary. Call Stop when done.
func StartPgbouncer(ctx context.Context, srv *Server) (*Pgbouncer, error) {
	bin, err := findPgbouncer()
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(srv.URL)
	if err != nil || target.Hostname() == "" || target.Port() == "" {
		return nil, fmt.Errorf("pgtest: pgbouncer needs a server URL with a host and port, not %s", redact(srv.URL))
	}
	owner, err := serverUser()
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		p, err := runPgbouncer(ctx, bin, target, owner)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return nil, err
		}
	}
}

func findPgbouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if isExecutable("/usr/sbin/pgbouncer") {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("%w in PATH or /usr/sbin (Debian/Ubuntu: apt-get install pgbouncer; macOS: brew install pgbouncer)", ErrNoPgbouncer)
}

// pgbouncerConfig is the configuration of a throwaway pgbouncer; the %s and %d are the
// server's host and port, the listen port and the directory of the user list.
const pgbouncerConfig = `[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s/userlist.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 8
max_db_connections = 16
server_idle_timeout = 5
ignore_startup_parameters = extra_float_digits
`

func runPgbouncer(ctx context.Context, bin string, target *url.URL, owner *osUser) (_ *Pgbouncer, err error) {
	dir, err := os.MkdirTemp("", "pgtest-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: temporary directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	user := target.User.Username()
	if user == "" {
		user = "postgres"
	}
	files := map[string]string{
		"pgbouncer.ini": fmt.Sprintf(pgbouncerConfig, target.Hostname(), target.Port(), port, dir),
		"userlist.txt":  strconv.Quote(user) + ` ""` + "\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return nil, fmt.Errorf("pgtest: write %s: %w", name, err)
		}
	}
	if owner != nil {
		if err := os.Chown(dir, owner.uid, owner.gid); err != nil {
			return nil, fmt.Errorf("pgtest: hand %s to OS user %s: %w", dir, owner.name, err)
		}
	}
	logPath := filepath.Join(dir, "pgbouncer.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgtest: pgbouncer log: %w", err)
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = serverProcAttr(owner)
	p := &Pgbouncer{URL: pooledURL(target, port, ""), port: port}
	if p.proc, err = runReady(ctx, cmd, dir, logFile, logPath, p.URL, "pgbouncer", port); err != nil {
		return nil, err
	}
	return p, nil
}

// pooledURL is target's URL with the pooler's port, for database (target's when "").
func pooledURL(target *url.URL, port int, database string) string {
	u := *target
	u.Host = "127.0.0.1:" + strconv.Itoa(port)
	if database != "" {
		u.Path = "/" + database
	}
	return u.String()
}

// URLFor returns a URL that connects through the pooler to database, with pgx's
// default_query_exec_mode set to mode (none when mode is 0, pgx's default).
func (p *Pgbouncer) URLFor(database string, mode pgx.QueryExecMode) string {
	u, _ := url.Parse(p.URL) // p.URL was made from a parsed URL
	s := pooledURL(u, p.port, database)
	if mode == 0 {
		return s
	}
	u, _ = url.Parse(s)
	q := u.Query()
	q.Set("default_query_exec_mode", strings.ReplaceAll(mode.String(), " ", "_")) // "cache describe" is written cache_describe
	u.RawQuery = q.Encode()
	return u.String()
}

// Stop shuts pgbouncer down and removes its directory. It is idempotent: later calls
// return the first call's result.
func (p *Pgbouncer) Stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.proc.stop() })
	return p.stopErr
}

// Kill ends pgbouncer at once (SIGKILL) and removes its directory: every client
// connection is cut, in the middle of a transaction too, as when a pooler crashes or
// its host restarts. Stop, by contrast, is pgbouncer's safe shutdown (SIGINT: it first
// waits for every transaction in progress to end, however long that takes). Kill and
// Stop share one result: a later call of either returns the first call's.
func (p *Pgbouncer) Kill() error {
	p.stopOnce.Do(func() {
		_ = p.proc.cmd.Process.Kill()
		<-p.proc.exited
		p.stopErr = p.proc.stop() // the process is gone: closes its log, removes its directory
	})
	return p.stopErr
}

// sharedPgbouncer is the process-wide pooler behind NewPooled, in front of the shared
// server; Main stops it.
var sharedPgbouncer struct {
	mu  sync.Mutex
	p   *Pgbouncer
	err error
}

// SharedPgbouncer returns the process-wide pgbouncer in front of the shared server,
// starting both on first use. A failed start is not retried, as with Shared.
func SharedPgbouncer(ctx context.Context) (*Pgbouncer, error) {
	sharedPgbouncer.mu.Lock()
	defer sharedPgbouncer.mu.Unlock()
	if sharedPgbouncer.p != nil || sharedPgbouncer.err != nil {
		return sharedPgbouncer.p, sharedPgbouncer.err
	}
	srv, err := Shared(ctx)
	if err != nil {
		return nil, err
	}
	p, err := StartPgbouncer(ctx, srv)
	if err != nil {
		if ctx.Err() == nil {
			sharedPgbouncer.err = err
		}
		return nil, err
	}
	sharedPgbouncer.p = p
	return p, nil
}

// stopSharedPgbouncer stops the shared pooler, if one was started; Main calls it
// before it stops the shared server.
func stopSharedPgbouncer() error {
	sharedPgbouncer.mu.Lock()
	p := sharedPgbouncer.p
	sharedPgbouncer.p, sharedPgbouncer.err = nil, nil
	sharedPgbouncer.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop()
}

// RequirePgbouncer skips t, with a message that says what to install, when there is no
// pgbouncer binary, unless EnvRequirePgbouncer is set: then it fails t.
func RequirePgbouncer(t testing.TB) {
	t.Helper()
	if _, err := findPgbouncer(); err != nil {
		if os.Getenv(EnvRequirePgbouncer) != "" {
			t.Fatalf("%v, and %s is set", err, EnvRequirePgbouncer)
		}
		t.Skipf("skipped: %v", err)
	}
}

// NewDatabase creates a uniquely named database on the shared server, applies
// migrations.Migrate in its public schema and opens a pool on it, directly. When the
// test ends the pool is closed and the database dropped (with FORCE: connections a
// pooler keeps to it are ended). DB.URL sets no search_path, so it is also what a
// pooler that refuses one can be pointed at; DB.Schema is "public".
func NewDatabase(t testing.TB) *DB {
	t.Helper()
	name := "t_" + randomHex(8)
	quoted := pgx.Identifier{name}.Sanitize()
	srv := createForTest(t, "database "+name, "CREATE DATABASE "+quoted, "DROP DATABASE IF EXISTS "+quoted+" WITH (FORCE)")
	u, err := url.Parse(srv.URL)
	if err != nil || u.Scheme == "" {
		t.Fatalf("pgtest: a database per test needs a URL-form server address, not %s", redact(srv.URL))
	}
	u.Path = "/" + name
	db := &DB{URL: u.String(), Schema: "public"}
	db.Pool = db.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Migrate(ctx, db.Pool); err != nil {
		t.Fatalf("pgtest: migrate database %s: %v", name, err)
	}
	return db
}

// Pooled is a fresh database reached through the shared pgbouncer.
type Pooled struct {
	// Direct is the database, straight on the server (a pool of its own, for tests to
	// look at what is stored without the pooler in between).
	Direct *DB
	// DB is the same database through pgbouncer in transaction mode: its URL and Pool
	// use PooledExecMode.
	DB *DB
	// Database is the database's name.
	Database string
	// Pgbouncer is the shared pooler.
	Pgbouncer *Pgbouncer
}

// NewPooled makes a fresh, migrated database (NewDatabase) and a pool on it through the
// shared pgbouncer, in PooledExecMode. It skips t when there is no pgbouncer binary,
// unless EnvRequirePgbouncer is set (see RequirePgbouncer).
func NewPooled(t testing.TB) *Pooled {
	t.Helper()
	RequirePgbouncer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := SharedPgbouncer(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	direct := NewDatabase(t)
	name := strings.TrimPrefix(mustParse(t, direct.URL).Path, "/")
	pooled := &DB{URL: p.URLFor(name, PooledExecMode), Schema: direct.Schema}
	pooled.Pool = pooled.NewPool(t)
	return &Pooled{Direct: direct, DB: pooled, Database: name, Pgbouncer: p}
}

// PoolInMode opens a pool through the pooler on the database with pgx's query exec
// mode set to mode (0: pgx's default), closed when the test ends.
func (p *Pooled) PoolInMode(t testing.TB, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	return (&DB{URL: p.Pgbouncer.URLFor(p.Database, mode), Schema: p.DB.Schema}).NewPool(t)
}

func mustParse(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", redact(s), err)
	}
	return u
}
