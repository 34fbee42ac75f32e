package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/migrations"
)

// cleanupTimeout bounds dropping a test's schema.
const cleanupTimeout = 30 * time.Second

// shared is the process-wide server behind Shared, New and Main.
var shared struct {
	mu       sync.Mutex
	srv      *Server
	err      error
	fallback Fallback // MainWith's
}

// Main is for TestMain. It starts nothing up front, runs the tests, stops the shared
// pgbouncer and server if a test started them, and returns the exit code for os.Exit. A failure to stop
// the server is printed and turns a passing run into a failing one.
func Main(m *testing.M) int { return MainWith(m, nil) }

// MainWith is Main with a Fallback for the shared server (nil: none), used when
// TEST_DATABASE_URL is not set and no local server binaries are found.
func MainWith(m *testing.M, fb Fallback) int {
	shared.mu.Lock()
	shared.fallback = fb
	shared.mu.Unlock()
	removeTemplate := allowTemplate()
	code := m.Run()
	removeTemplate()
	if err := stopSharedPgbouncer(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: stop shared pgbouncer: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	shared.mu.Lock()
	srv := shared.srv
	shared.srv, shared.err = nil, nil
	shared.mu.Unlock()
	if srv != nil {
		if err := srv.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stop shared server: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Shared returns the process-wide server, starting it with Start on first use. Callers
// wait for a start in progress. A failed start is not retried: every later call returns
// the same error, so that each test reports it rather than waiting for another attempt.
// The start does not end with the caller's ctx (see sharedStartTimeout).
func Shared(ctx context.Context) (*Server, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil {
		return shared.srv, nil
	}
	if shared.err != nil {
		return nil, shared.err
	}
	// The first caller starts the server every test of the package shares, while the
	// others wait on the lock: the start is bounded by sharedStartTimeout, not by that
	// caller's context. A test's own bound, sized for one test, was outlasted by initdb
	// on a loaded machine; the start was killed half-way and every test waiting behind
	// it failed, each retrying with what was left of its own bound.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sharedStartTimeout)
	defer cancel()
	srv, err := startShared(sctx)
	if err != nil {
		shared.err = err
		return nil, err
	}
	shared.srv = srv
	return srv, nil
}

// sharedStartTimeout bounds the start of the shared server (initdb, start, readiness;
// a Citus cluster's three nodes): a bound on a hang, generous for a loaded machine.
const sharedStartTimeout = 10 * time.Minute

// startShared starts the shared server: a Citus cluster's coordinator when EnvCitus
// asks for one (and TEST_DATABASE_URL does not name a server), else Start's server.
func startShared(ctx context.Context) (*Server, error) {
	if !CitusMode() || os.Getenv(EnvDatabaseURL) != "" {
		return StartWith(ctx, &StartOptions{Fallback: shared.fallback})
	}
	c, err := StartCitus(ctx)
	if err != nil {
		return nil, err
	}
	return c.asServer(), nil
}

// DB is a fresh schema on the shared server, dropped when the test that made it ends.
type DB struct {
	// Pool's connections have search_path = Schema. It is closed when the test ends.
	Pool *pgxpool.Pool
	// URL connects with search_path = Schema (pgx sends the search_path parameter as a
	// run-time parameter), for other pools and child processes.
	URL string
	// Schema is the schema's name, t_ followed by 16 hex digits.
	Schema string
}

// New creates a uniquely named schema on the shared server, applies migrations.Migrate
// in it (and, when EnvCitus is set, migrations.Distribute) and opens a pool on it. When the test ends every key row left
// is checked against the state rules (CheckKeyStates: the test fails on a row that
// breaks them), then the pool is closed and the schema dropped with everything in it.
// It fails the test if there is no server.
func New(t testing.TB) *DB {
	t.Helper()
	db := NewEmpty(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Migrate(ctx, db.Pool); err != nil {
		t.Fatalf("pgtest: migrate schema %s: %v", db.Schema, err)
	}
	if err := distributeForTest(ctx, db); err != nil {
		t.Fatalf("pgtest: distribute the key table of schema %s: %v", db.Schema, err)
	}
	checkStatesAtEnd(t, db)
	return db
}

// NewEmpty is New without the migrations: an empty schema and a pool on it.
func NewEmpty(t testing.TB) *DB {
	t.Helper()
	schema := "t_" + randomHex(8)
	quoted := pgx.Identifier{schema}.Sanitize()
	// A transaction left open on the schema's tables would block the drop: give up with
	// an error rather than hang.
	srv := createForTest(t, "schema "+schema, "CREATE SCHEMA "+quoted,
		"SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS "+quoted+" CASCADE")
	db := &DB{URL: withSearchPath(srv.URL, schema), Schema: schema}
	db.Pool = db.NewPool(t)
	return db
}

// createForTest runs create on the shared server, failing t if there is no server or
// create fails, and registers drop to run when t ends. Registered before the pool's
// cleanup, it runs after the pool is closed. It returns the server.
func createForTest(t testing.TB, what, create, drop string) *Server {
	t.Helper()
	// The shared server first (it may take minutes to start on a loaded machine, see
	// sharedStartTimeout), then the bound on this test's own statements.
	srv, err := Shared(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := srv.exec(ctx, create); err != nil {
		t.Fatalf("pgtest: create %s: %v", what, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := srv.exec(ctx, drop); err != nil {
			t.Errorf("pgtest: drop %s: %v", what, err)
		}
	})
	return srv
}

// NewPool opens another, independent pool on the same schema, closed when the test ends.
// Tests use separate pools to play separate executors.
func (db *DB) NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatalf("pgtest: open pool on schema %s: %v", db.Schema, err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pgtest: connect to schema %s: %v", db.Schema, err)
	}
	return pool
}

// withSearchPath returns connString with search_path set to schema, in URL or
// keyword/value form.
func withSearchPath(connString, schema string) string {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		if u, err := url.Parse(connString); err == nil {
			q := u.Query()
			q.Set("search_path", schema)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return connString + " search_path=" + schema
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}
