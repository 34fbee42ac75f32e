package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/cpumeter"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// benchDB is the database the bench works in: a fresh database on the server, or, when
// the server refuses CREATE DATABASE, a fresh schema in the given one.
type benchDB struct {
	serverURL string // superuser (or the given user) on the server's own database
	name      string // the bench database
	schema    string // set when a schema stands in for a database
	drop      func(ctx context.Context) error
}

// machine describes where the numbers come from.
type machine struct {
	cpus        int
	cpuModel    string
	memory      string
	goVersion   string
	pgVersion   string
	pgVersionN  int
	fsync       string
	syncCommit  string
	sharedBufs  string
	maxWalSize  string
	dataFS      string // the file system under the data directory (datafs.go)
	throwaway   bool
	sharedDB    bool   // a schema in an existing database: pg_stat_database counts others too
	loadAverage string // at the start
	citus       bool   // the key and charges tables are distributed on a Citus coordinator
	citusNodes  int    // nodes of a -citus cluster (0: not started by the bench)
}

// benchServerSettings are the throwaway server's settings beyond pgtest's: every
// variant of the rounds keeps a pool as large as the largest concurrency open for the
// whole run (nine pools of 32 with the losing copies'), and the later parts open
// their own beside them, more than pgtest's 300 connections.
var benchServerSettings = []string{"max_connections=500"}

// env is everything the rounds share.
type env struct {
	o       *options
	db      benchDB
	srv     *pgtest.Server // nil when -db or $DATABASE_URL was used
	citus   bool           // a Citus coordinator: the key and charges tables are distributed
	machine machine
	admin   *pgx.Conn     // on the server's own database: snapshots, never in the bench database's stats
	check   *pgxpool.Pool // on the bench database, untraced: set-up and verification outside the cells
	sampler *pgx.Conn     // on the server's own database: pg_stat_activity samples
	runID   string
	cpu     *cpumeter.Meter
	nodes   []*cpumeter.Meter // a throwaway Citus cluster's workers: their CPU is the server's too
	cluster *pgtest.Citus     // -citus
	pgss    bool              // pg_stat_statements can be read: the statement breakdown
	dbOID   uint32            // the bench database, in pg_stat_statements

	httpClient *http.Client
	fast, slow *httptest.Server // providers at latency 0 and at o.slowLatency

	variants []*variant // bare, recipe, recipe-fused, recipe-fused-safe, idemflow, idemflow-replay
	control  *variant   // holds a transaction across the call: the slow run's negative control
	replay   *keyRing
	seq      seqCounter

	figs *figures // figures parts of the run hand the report's budget (partitionChecks)

	partFS string // the partitions part's server: its data directory's file system (datafs.go)

	onClose []func() // what variants hold for the whole run (held claim locks), let go first by close
}

func newEnv(ctx context.Context, o *options) (_ *env, err error) {
	e := &env{o: o, runID: randomHex(4), replay: newKeyRing(50000), figs: &figures{}}
	defer func() {
		if err != nil {
			e.close(false)
		}
	}()
	serverURL := o.db
	if serverURL == "" {
		serverURL = os.Getenv("DATABASE_URL")
	}
	if o.citus {
		if serverURL, err = e.startCitus(ctx); err != nil {
			return nil, err
		}
	}
	if serverURL == "" {
		logf("starting a throwaway PostgreSQL server (set DATABASE_URL to use another)")
		srv, err := pgtest.StartWith(ctx, &pgtest.StartOptions{Settings: append(slices.Clone(pgssSettings), benchServerSettings...)})
		if err != nil && !errors.Is(err, pgtest.ErrNoServer) {
			// Most likely no pg_stat_statements library (a server without contrib):
			// the run goes on without the statement breakdown.
			logf("the server did not start with pg_stat_statements (%v); starting it without", err)
			srv, err = pgtest.StartWith(ctx, &pgtest.StartOptions{Settings: benchServerSettings})
		}
		if err != nil {
			return nil, err
		}
		e.srv = srv
		serverURL = srv.URL
		e.machine.throwaway = os.Getenv(pgtest.EnvDatabaseURL) == ""
	}
	if e.citus, err = hasCitus(ctx, serverURL, o.distribute); err != nil {
		return nil, err
	}
	e.db, err = createDB(ctx, serverURL, "idemflow_bench_"+e.runID, e.citus)
	if err != nil {
		return nil, err
	}
	e.machine.sharedDB = e.db.schema != ""
	if e.admin, err = pgx.Connect(ctx, serverURL); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if e.sampler, err = pgx.Connect(ctx, serverURL); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	for _, c := range []*pgx.Conn{e.admin, e.sampler} {
		// Read pg_stat_* fresh on every statement, never from a cached snapshot.
		_, _ = c.Exec(ctx, "SET stats_fetch_consistency = none")
	}
	e.cpu = cpumeter.New(ctx, e.admin)
	if err := e.describe(ctx); err != nil {
		return nil, err
	}
	if e.check, err = e.newPool(ctx, 4, nil); err != nil {
		return nil, err
	}
	if err := e.migrate(ctx); err != nil {
		return nil, err
	}
	e.pgss = e.enablePgss(ctx)

	e.httpClient = &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute,
			DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		},
	}
	e.fast = httptest.NewServer(chargeflow.NewProvider(0, 0).Handler())
	e.slow = httptest.NewServer(chargeflow.NewProvider(o.slowLatency, 0).Handler())
	if err := e.newVariants(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *env) close(keep bool) {
	for _, f := range e.onClose {
		f()
	}
	if e.httpClient != nil {
		e.httpClient.CloseIdleConnections()
	}
	for _, s := range []*httptest.Server{e.fast, e.slow} {
		if s != nil {
			s.Close()
		}
	}
	for _, v := range append(append([]*variant(nil), e.variants...), e.control) {
		if v != nil && v.pool != nil && v.ownsPool {
			v.pool.Close()
		}
	}
	if e.check != nil {
		e.check.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []*pgx.Conn{e.admin, e.sampler} {
		if c != nil {
			c.Close(ctx)
		}
	}
	if e.db.drop != nil && !keep {
		if err := e.db.drop(ctx); err != nil {
			logf("drop the bench database: %v", err)
		}
	}
	if e.srv != nil && !keep {
		if err := e.srv.Stop(); err != nil {
			logf("stop the server: %v", err)
		}
	}
	if e.cluster != nil && !keep {
		if err := e.cluster.Stop(); err != nil {
			logf("stop the Citus cluster: %v", err)
		}
	}
}

// createDB creates a fresh database, or a fresh schema if the server refuses.
func createDB(ctx context.Context, serverURL, name string, inSchema bool) (benchDB, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return benchDB{}, fmt.Errorf("connect to %s: %w", redactURL(serverURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	db := benchDB{serverURL: serverURL, name: name}
	quoted := pgx.Identifier{name}.Sanitize()
	if inSchema {
		// Citus: a new database would need the extension and the workers set up in it.
		logf("Citus coordinator: using a fresh schema of %s", conn.Config().Database)
	} else if _, err := conn.Exec(ctx, "CREATE DATABASE "+quoted); err == nil {
		db.drop = func(ctx context.Context) error {
			c, err := pgx.Connect(ctx, serverURL)
			if err != nil {
				return err
			}
			defer c.Close(ctx)
			_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+quoted+" WITH (FORCE)")
			return err
		}
		return db, nil
	} else {
		logf("CREATE DATABASE refused (%v); using a fresh schema instead", err)
	}
	db.name = conn.Config().Database
	db.schema = name
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
		return benchDB{}, fmt.Errorf("create schema: %w", err)
	}
	db.drop = func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+quoted+" CASCADE")
		return err
	}
	return db, nil
}

// childDB is a child process's bench database: the flags that name it (childArgs
// passes them) and a pool on it.
type childDB struct{ serverURL, database, schema *string }

// childDBFlags registers the database flags on fs.
func childDBFlags(fs *flag.FlagSet) childDB {
	return childDB{
		serverURL: fs.String("url", "", "server URL"),
		database:  fs.String("db", "", "database"),
		schema:    fs.String("schema", "", "schema (when a schema stands in for a database)"),
	}
}

// childArgs are the flags that give a child process the bench database.
func (db benchDB) childArgs() []string {
	return []string{"-url", db.serverURL, "-db", db.name, "-schema", db.schema}
}

// pool connects, after the flags were parsed, a pool of at most maxConns on the database.
func (d childDB) pool(ctx context.Context, appName string, maxConns int32) (*pgxpool.Pool, error) {
	return d.tracedPool(ctx, appName, maxConns, nil)
}

// tracedPool is pool with tr (nil: none) counting what it sends.
func (d childDB) tracedPool(ctx context.Context, appName string, maxConns int32, tr *tracer) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(*d.serverURL, *d.database, *d.schema, appName, maxConns)
	if err != nil {
		return nil, err
	}
	if tr != nil {
		tr.install(cfg)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// poolConfig returns a pool configuration on the bench database.
func poolConfig(serverURL, database, schema, appName string, maxConns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Database = database
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	cfg.MaxConns = maxConns
	cfg.MinConns = 0
	cfg.MaxConnIdleTime = time.Hour
	cfg.MaxConnLifetime = 2 * time.Hour
	return cfg, nil
}

func (e *env) newPool(ctx context.Context, maxConns int32, tr *tracer) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(e.db.serverURL, e.db.name, e.db.schema, appLive, maxConns)
	if err != nil {
		return nil, err
	}
	if tr != nil {
		tr.install(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// migrate applies idemflow's migrations, the charges table and the recipe's key table.
func (e *env) migrate(ctx context.Context) error {
	pool := e.check
	if err := migrations.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, chargeflow.Schema); err != nil {
		return fmt.Errorf("create charges table: %w", err)
	}
	if e.citus {
		if err := e.distribute(ctx); err != nil {
			return err
		}
	}
	for _, table := range []string{"recipe_keys", "fused_keys"} {
		if _, err := pool.Exec(ctx, keyTableSchema(table)); err != nil {
			return fmt.Errorf("create %s: %w", table, err)
		}
	}
	if _, err := pool.Exec(ctx, safeKeysDDL); err != nil {
		return fmt.Errorf("create safe_keys: %w", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE bench_dup_effects (scope text NOT NULL, idempotency_key text NOT NULL, at timestamptz NOT NULL DEFAULT now())"); err != nil {
		return fmt.Errorf("create the duplicates experiment's table: %w", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE bench_flush (one int); INSERT INTO bench_flush VALUES (1)"); err != nil {
		return fmt.Errorf("create flush table: %w", err)
	}
	return nil
}

// describe fills in the machine description.
func (e *env) describe(ctx context.Context) error {
	m := &e.machine
	m.cpus = runtime.NumCPU()
	m.goVersion = runtime.Version()
	m.cpuModel = firstField("/proc/cpuinfo", "model name")
	if kb := firstField("/proc/meminfo", "MemTotal"); kb != "" {
		var n int64
		if _, err := fmt.Sscanf(kb, "%d kB", &n); err == nil {
			m.memory = fmt.Sprintf("%.1f GiB", float64(n)/(1<<20))
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.loadAverage = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	var versionNum string
	err := e.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('server_version_num'),
		current_setting('fsync'), current_setting('synchronous_commit'), current_setting('shared_buffers'),
		current_setting('max_wal_size')`).
		Scan(&m.pgVersion, &versionNum, &m.fsync, &m.syncCommit, &m.sharedBufs, &m.maxWalSize)
	if err != nil {
		return fmt.Errorf("read server settings: %w", err)
	}
	fmt.Sscanf(versionNum, "%d", &m.pgVersionN)
	m.dataFS = discardNote(dataFileSystem(ctx, e.db.serverURL))
	if m.pgVersionN < 150000 {
		return fmt.Errorf("PostgreSQL %s: the bench needs 15 or later (pg_stat_force_next_flush, pg_current_snapshot)", m.pgVersion)
	}
	return nil
}

// firstField returns the value of the first "name : value" line of a /proc file.
func firstField(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func (e *env) engine(pool *pgxpool.Pool, providerURL string, hooks workflow.Hooks) (*workflow.Engine, error) {
	eng, err := workflow.New(pool, &workflow.Config{Hooks: hooks})
	if err != nil {
		return nil, err
	}
	client := &chargeflow.ProviderClient{BaseURL: providerURL, HTTP: e.httpClient}
	if err := eng.Register(chargeflow.Flow(client)); err != nil {
		return nil, err
	}
	return eng, nil
}

// variant returns the variant of that name.
func (e *env) variant(name string) *variant {
	for _, v := range e.variants {
		if v.name == name {
			return v
		}
	}
	panic("bench: no variant " + name)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "(connection string)"
	}
	return u.Redacted()
}

var errInvariant = errors.New("invariant violated")

// Application names of the bench's connections, to tell live traffic from sweepers in
// pg_stat_activity.
const (
	appLive    = "idemflow-bench"
	appSweeper = "idemflow-bench-sweeper"
)
