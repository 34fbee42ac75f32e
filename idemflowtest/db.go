package idemflowtest

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// EnvDatabaseURL names the environment variable that points the tests at an existing
// server instead of a throwaway one.
const EnvDatabaseURL = pgtest.EnvDatabaseURL

// DB is a fresh, migrated schema of its own for one test, on a real PostgreSQL server.
type DB struct {
	// Pool's connections have search_path = Schema. It is closed when the test ends.
	Pool *pgxpool.Pool
	// URL connects with search_path = Schema, for other pools and processes.
	URL string
	// Schema is the schema's name, t_ followed by 16 hex digits.
	Schema string

	pg *pgtest.DB // nil in a crash child
}

// NewDB creates a uniquely named schema on the test server (see the package doc for
// where the server comes from), applies idemflow's migrations in it, runs the setup
// statements (for example the flow's own tables) and opens a pool on it. When the test
// ends the pool is closed and the schema dropped with everything in it. It fails the
// test if there is no server, naming what to install.
//
// In a crash matrix's child process (see Crash) NewDB returns the parent's database
// instead, and runs no setup statement: the parent did.
func NewDB(t testing.TB, setup ...string) *DB {
	t.Helper()
	if child != nil {
		return child.db(t)
	}
	pg := pgtest.New(t)
	db := &DB{Pool: pg.Pool, URL: pg.URL, Schema: pg.Schema, pg: pg}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, sql := range setup {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("idemflowtest: setup of schema %s: %v", db.Schema, err)
		}
	}
	shares.add(t, shareDB, db.URL)
	return db
}

// NewPool opens another, independent pool on the same schema, closed when the test
// ends. Tests use separate pools to play separate processes.
func (db *DB) NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	if db.pg == nil {
		return childPool(t, db.URL)
	}
	return db.pg.NewPool(t)
}

// Options adjust Main and Run.
type Options struct {
	// Fallback starts the tests' PostgreSQL server when TEST_DATABASE_URL is not set and
	// no local server binaries are found: it returns a superuser URL to the server's
	// default database and a function that stops it, and the kit waits for the URL to
	// accept connections. nil: the tests fail, naming what to install. pgdocker.Start
	// (module github.com/idemflow/idemflow/idemflowtest/pgdocker, which brings Docker's
	// client libraries) starts a postgres:15 container.
	Fallback func(ctx context.Context, settings []string) (url string, stop func() error, err error)
	// Cleanup functions run after the tests and before the leak check, for what the
	// package's tests share (a browser, say).
	Cleanup []func()
}

// Run runs the tests of a package as Main does and returns the exit code, for a
// TestMain that has more to do before it exits. The cleanup functions run after the
// tests and before the leak check, for what the package's tests share (a browser, say).
func Run(m *testing.M, cleanup ...func()) int { return RunWith(m, Options{Cleanup: cleanup}) }

// RunWith is Run with options.
func RunWith(m *testing.M, opts Options) int {
	if child != nil { // a crash matrix's child: it ends at its boundary
		return m.Run()
	}
	childproc.RunIfChild()
	before := goleak.IgnoreCurrent() // what runs before the tests is not a leak of theirs
	code := pgtest.MainWith(m, opts.Fallback)
	for _, c := range opts.Cleanup {
		c()
	}
	if code == 0 {
		// Keep-alive connections of http.DefaultClient (a fake remote's callers) are
		// idle, not leaked.
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		if err := goleak.Find(before); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	return code
}

// Main is a package's TestMain: it runs the tests, stops the throwaway server they
// shared, fails the run if a test left a goroutine behind (go.uber.org/goleak), and
// exits. In a child process of a crash matrix or of idemflow's own suites it runs the
// child instead.
//
//	func TestMain(m *testing.M) { idemflowtest.Main(m) }
func Main(m *testing.M) { os.Exit(Run(m)) }

// MainWith is Main with options, for example a container when the machine has no
// PostgreSQL server binaries:
//
//	func TestMain(m *testing.M) {
//		idemflowtest.MainWith(m, idemflowtest.Options{Fallback: pgdocker.Start})
//	}
func MainWith(m *testing.M, opts Options) { os.Exit(RunWith(m, opts)) }

// NewExampleDB is NewDB for a testable example, which has no *testing.T: a fresh,
// migrated schema on the test server, a pool on it, and a function that closes the pool
// and drops the schema. An example that cannot get a server prints the error instead of
// its output, so it fails saying what to install.
func NewExampleDB(ctx context.Context) (*pgxpool.Pool, func(), error) {
	return pgtest.Example(ctx)
}
