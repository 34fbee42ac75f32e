// Package reliability holds idemflow's reliability suite: experiments that inject real
// faults (SIGKILLed and SIGSTOPped processes, a Postgres server crashed with an
// immediate shutdown and restarted, terminated backends, lost commit acknowledgements,
// refused connections, latency, blackholes, connection resets and half-open
// connections, an exhausted pool, randomized schedules with moves of the database
// clock) and then check the same invariants after every one of them: one key row and
// one effect per key, one provider payment per derived key, every key finished, every
// answer a client got either retryable or the stored answer byte for byte, and
// recovery points and lock versions that never went backwards.
//
// The package has no API: it is its tests. `go test ./reliability/` runs the quick
// tier (CI runs it); `IDEMFLOW_LONG=1 go test -count=1 -timeout 60m ./reliability/`
// runs the same experiments at full counts. docs/RELIABILITY.md describes each
// experiment, the guarantee it backs and the figures of the last long run.
//
// The tests re-execute the test binary as child processes (to crash or pause a real
// process) and build examples/charges once (to crash the HTTP server between storing
// a response and writing it).
//
// This package's tests import idemflow's workflow, sweeper, store, phases,
// examples/charges/chargeflow, internal/pgtest, internal/faultproxy and
// internal/phaserun (to wrap a flow's first phase) packages.
package reliability
