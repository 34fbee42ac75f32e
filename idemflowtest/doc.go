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
// else a postgres:15 container through dockertest when a Docker daemon answers; else
// the test fails with a message naming what to install. One server is shared by all
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
// dockertest (the Docker fallback) is a dependency of idemflow's root module. Measured
// with a scratch module that imports only workflow and runs go mod tidy: its go.sum has
// 93 lines, 12 of them naming docker modules and 50 due to dockertest's module graph
// (26 modules, 13 MB of module zips that go mod tidy downloads; they are there because
// tidy records the dependencies of the tests of the packages a module imports). No
// docker code is compiled into a user's binary (go list -deps shows none) and go build
// downloads none of it. Moving the Docker fallback into a nested module would cut the
// go.sum to 43 lines, but idemflow's own tests could then only use it by requiring that
// module, which brings the lines back; so the kit stays in the root module, and
// production packages (phases, store, workflow, idemhttp, sweeper, migrations) import
// neither it nor dockertest.
//
// This package imports idemflow's phases, workflow and sweeper packages,
// internal/pgtest (and through it migrations and dockertest), internal/childproc,
// internal/runstate (a phase's derived key, as a run makes it), pgx and go.uber.org/goleak. No production package imports it. The
// crash matrix's child processes need a Unix system.
package idemflowtest
