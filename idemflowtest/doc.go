// Package idemflowtest is idemflow's test kit: it lets a team prove its own flows
// crash-safe, with the same machinery idemflow's own suites use.
//
//   - NewDB gives a test a fresh, migrated schema of its own on a real PostgreSQL
//     server, dropped when the test ends; Main is the TestMain that owns the server's
//     lifetime and fails the run if a test leaves a goroutine behind.
//   - CrashMatrix runs one request of a flow once per boundary of the flow (after the
//     claim, before and after each tx phase's commit, before and after each call, after
//     the response is stored) in a real child process that kills itself with SIGKILL
//     there, then recovers the key by the client's retry, by a sweeper, and by a sweeper
//     after another sweeper process was killed; it requires every replay to be
//     byte-identical and runs the test's own check of the effects. Crash.InProcess
//     abandons the attempt in the test's process instead, for fast unit tests. RunMatrix
//     reports the failing cases instead of failing, for testing a test.
//   - ExpireLease moves a key's lease, backoff and grace period into the past by the
//     database clock, so that a test takes it over or sweeps it at once, without
//     sleeping.
//   - NewRemote starts a fake external service (HTTP) that dedupes on the
//     Idempotency-Key header, with latency, failures, declines and counts per key, for
//     call phases.
//   - RequireFinished, RequireInProgressAt and RequireDeadLettered check a key's state;
//     a Watcher checks the key table's invariants while users' own load tests run.
//
// Crash-testing a flow takes a few lines in the flow's test file (these are
// examples/authcapture's):
//
//	func TestMain(m *testing.M) { idemflowtest.Main(m) }
//
//	func TestOrderSurvivesCrashes(t *testing.T) {
//		db := idemflowtest.NewDB(t, authcapture.Schema)
//		provider := idemflowtest.NewRemote(t, nil)
//		idemflowtest.CrashMatrix(t, idemflowtest.Crash{
//			DB:      db,
//			Flow:    authcapture.Flow(provider.URL),
//			Request: workflow.Request{Scope: "acct", Key: "order-1", Body: []byte(`{"amount":500}`)},
//			Check:   func(t testing.TB, c *idemflowtest.Case) { requirePaidOnce(t, c, provider) },
//		})
//	}
//
// A child process runs the test function again from the top (the test binary is
// re-executed with -test.run naming the test): NewDB and NewRemote give it the parent's
// database and remotes, and the matrix call runs the one attempt and dies at its
// boundary. Code before the matrix call should therefore only make databases and
// remotes, and leave writes to NewDB's setup statements.
//
// # Where the server comes from
//
// In order: the server at TEST_DATABASE_URL when that is set (never stopped by the
// kit); else a throwaway server from local PostgreSQL server binaries (initdb and
// postgres found through PATH, `pg_config --bindir` or /usr/lib/postgresql/*/bin),
// initialised in a temporary directory, listening on 127.0.0.1 on a free port with
// fsync on, and run as the unprivileged postgres OS user when the tests run as root;
// else the Fallback passed to MainWith or RunWith, if any (pgdocker.Start, a postgres:15
// container through dockertest); else the test fails with a message naming what to
// install. One server is shared by all
// the tests of a package binary and stopped by Main.
//
// # What it costs
//
// A crash matrix of a flow with n phases has 2n+2 boundaries (2n+1 when the flow starts
// with a call), and a case per boundary and recovery: three per boundary by default,
// each a child process, plus a sweeper child for a third of them. Measured on the
// 2-core development machine while other test runs shared it (load average 6 to 6.8),
// with `go test -run 'TestOrderSurvivesCrashes$' -count=5 -v ./examples/authcapture`:
// the four-phase flow of examples/authcapture (10 boundaries, 30 cases) took 1.4s to
// 2.5s once the package's server was up, about 0.35s to 0.65s per phase (45 to 85ms a
// case); the first matrix of a test binary also waits for the throwaway server to start
// (about 2.5s there). In process (Crash.InProcess, two recoveries) the three-phase flow
// of this package's tests (8 boundaries, 16 cases) took 0.08s to 0.10s, about 0.03s per
// phase.
//
// # Dependencies
//
// The kit is in idemflow's module, whose requirements are the library's own (pgx,
// scany, the JSON and structured-field libraries, the OpenTelemetry API, testify,
// goleak). The Docker fallback is not: it is the package pgdocker, in the module
// github.com/idemflow/idemflow/idemflowtest/pgdocker, which a team's tests require only
// if they want a container:
//
//	func TestMain(m *testing.M) {
//		idemflowtest.MainWith(m, idemflowtest.Options{Fallback: pgdocker.Start})
//	}
//
// This package imports idemflow's phases, workflow and sweeper packages,
// testkit/pgtest (and through it migrations), testkit/childproc,
// internal/runstate (a phase's derived key, as a run makes it), pgx and go.uber.org/goleak. No production package imports it. The
// crash matrix's child processes need a Unix system.
package idemflowtest
