// Package reliability holds idemflow's reliability suite: experiments that inject real
// faults (SIGKILLed and SIGSTOPped processes, a Postgres server crashed with an
// immediate shutdown and restarted, terminated backends, lost commit acknowledgements,
// refused connections, latency, blackholes, connection resets and half-open
// connections, an exhausted pool, a NATS server restarted under its consumers,
// operators releasing and re-driving keys through the admin API and the CLI,
// randomized schedules with moves of the database clock) and then check the same
// invariants after every one of them: one key row and one effect per key, one
// provider payment per derived key, every key finished, every answer a client got
// either retryable or the stored answer byte for byte, and recovery points and lock
// versions that never went backwards. Two checks look where a rollback cannot reach:
// the ledger flow's phases also advance a sequence, take an advisory lock, write to a
// second database and post to an HTTP side channel, and each of those must have
// happened exactly once per committed phase and never for an attempt that did not own
// the key; and a history checker requires every client's answers, and every tx phase
// commit an engine of the test process reported, to fit one serial execution per key.
//
// The package has no API: it is its tests. `go test ./reliability/` runs the quick
// tier (CI runs it); `IDEMFLOW_LONG=1 go test -count=1 -timeout 60m ./reliability/`
// runs the same experiments at full counts; `IDEMFLOW_NIGHTLY=1 go test -count=1
// -timeout 70m -v ./reliability/` runs them at the nightly tier's scale (more than ten
// thousand destructive faults, five hundred model seeds); `IDEMFLOW_SOAK=1 go test
// -count=1 -timeout 90m -run 'TestSoak$' -v ./reliability/` runs the soak for an hour
// (IDEMFLOW_SOAK_DURATION, default 1h; its CSV files and chart go to
// IDEMFLOW_SOAK_OUT), which the quick tier runs for 90 seconds. docs/RELIABILITY.md
// describes each experiment, the guarantee it backs and the figures of the last
// nightly run.
//
// The tests re-execute the test binary as child processes (to crash or pause a real
// process), build examples/charges, examples/payouts and cmd/idemflow once each (to
// crash the HTTP server and the consumer, and to run the CLI as an operator would),
// and start a NATS server of their own from /usr/sbin/nats-server (the consumer
// experiment is skipped without it).
//
// This package's tests import idemflow's workflow, sweeper, store, phases, idemhttp,
// idemflowtest, examples/charges/chargeflow, examples/payouts/payout, testkit/pgtest,
// testkit/faultproxy, testkit/childproc and testkit/testflow packages. It is a module of its own (github.com/idemflow/idemflow/reliability),
// joined to the library and the examples by the repository's go.work.
package reliability
