// Package testkit is the root of idemflow's test-support tree: the packages below it
// serve idemflow's own tests, examples, benchmark and reliability experiments, and
// carry no compatibility promise (a team testing its own flows uses idemflowtest).
//
//   - pgtest: throwaway PostgreSQL servers, pgbouncer and Citus clusters, a schema per test
//   - childproc: the one harness for tests that run, pause and kill a child process
//   - faultproxy: a TCP proxy between a client and PostgreSQL that injects faults
//   - testflow: the fake payment flow shared by the workflow, sweeper and reliability tests
//   - coretest, pooltest: engine behaviours run against several pools and poolers
//   - matrix: every phase shape in every state it can meet (DESIGN.md invariant 14)
//   - cpumeter: CPU time of a process and its PostgreSQL backends, for the benchmark
//   - skewtest: the previous release and this tree on one schema (the upgrade contract)
//   - tenants: two tenants on a pool of one connection (a transaction ends with its phase)
//   - uitest: the fixture of the operator page's tests
//   - retention: the engine's batched retention statement alone, for the benchmark
//   - gosource: a package's own Go source, for tests that hold the code to a rule read from it
//
// The engine's own machinery stays in internal/. Packages of the other modules of the
// repository (examples, bench, reliability) import these public packages, never the
// library's internal/.
package testkit
