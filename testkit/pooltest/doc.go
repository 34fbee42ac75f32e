// Package pooltest holds no code, only tests: the engine, the sweeper and the HTTP
// layer run through a real pgbouncer in transaction pooling mode, in the pgx query exec
// mode the README documents for it (pgtest.PooledExecMode), each test on a database of
// its own (pgbouncer refuses the search_path startup parameter that schema-per-test
// relies on). A wrong mode is shown to fail with workflow.ErrMisconfigured. The tests
// skip only when there is no pgbouncer binary, and fail instead when
// PGTEST_REQUIRE_PGBOUNCER is set, as CI does. The charges example's acceptance tests
// and demo run through pgbouncer in examples/charges.
//
// This package imports idemflow's workflow, sweeper and idemhttp packages and its
// internal test packages.
package pooltest
