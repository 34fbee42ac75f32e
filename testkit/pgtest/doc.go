// Package pgtest provides a real PostgreSQL server for idemflow's tests and its demo,
// and a fresh, migrated schema per test on that server.
//
// Where the server comes from, in order:
//
//  1. TEST_DATABASE_URL, when set: an existing server; pgtest never stops it.
//  2. A throwaway server from local PostgreSQL server binaries (initdb and postgres found
//     through PATH, `pg_config --bindir` or /usr/lib/postgresql/*/bin, newest first),
//     initialised in a temporary directory, listening on 127.0.0.1 on a free port with
//     unix sockets off and fsync on. When the process runs as root the server runs as
//     the unprivileged `postgres` OS user, since PostgreSQL refuses to run as root.
//  3. A Fallback, when the caller passes one (StartOptions, MainWith): idemflowtest's
//     users pass pgdocker.Start, a postgres:15 container, from a module of its own so
//     that Docker's client libraries are in no other module's graph.
//
// Otherwise Start fails with ErrNoServer and a message that says what to install. A
// throwaway server never touches a cluster that is already running on the machine.
//
// Usage in a package's tests:
//
//	func TestMain(m *testing.M) {
//		os.Exit(pgtest.Main(m)) // stops the shared server after the tests
//	}
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		db := pgtest.New(t) // its own schema, migrated; dropped when the test ends
//		_, err := db.Pool.Exec(ctx, `...`)
//		other := db.NewPool(t) // a second, independent pool on the same schema
//	}
//
// To combine with goleak, check for leaks after Main has stopped the server:
//
//	func TestMain(m *testing.M) {
//		code := pgtest.Main(m)
//		if code == 0 {
//			if err := goleak.Find(); err != nil {
//				fmt.Fprintln(os.Stderr, err)
//				code = 1
//			}
//		}
//		os.Exit(code)
//	}
//
// Tests of what runs behind a connection pooler use a database of their own
// (NewDatabase), since pgbouncer refuses the search_path a schema per test needs, and
// NewPooled reaches it through a throwaway pgbouncer in transaction mode
// (StartPgbouncer, shared by the process like the server and stopped by Main), in
// PooledExecMode. Without a pgbouncer binary such tests skip (RequirePgbouncer), unless
// PGTEST_REQUIRE_PGBOUNCER is set, as in CI: then they fail.
//
// A program such as the demo calls Start and Stop itself. A throwaway server is stopped
// by Stop or Main; if the process dies first, Linux delivers SIGQUIT to the server (an
// immediate shutdown) and only its temporary directory is left behind.
//
// It is part of idemflow's test-support tree (testkit/): it serves idemflow's own tests,
// its examples, benchmark and reliability suites, and carries no compatibility promise.
// This package imports only idemflow's migrations package.
package pgtest
