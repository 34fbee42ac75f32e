// Package matrix holds no code, only a test: TestMatrix runs every phase shape of the
// engine (a Go-code tx phase first, a pipelined tx phase first, in two round trips or
// in one, a call phase first, idemhttp.Middleware, an answer stored alone) in every state it can meet (the key
// table plain, or partitioned with its layout learnt or not; the five pgx query exec
// modes; cold or warm connections; straight on Postgres or through pgbouncer in
// transaction mode; after an attempt abandoned at each of the flow's crash points, or
// none), and holds every cell to the same checks: one key row, one effect and one
// derived key per key; losers run none of the user's statements, not even a Parse,
// and answer at once without waiting on a lock; every answer a documented one
// (DESIGN.md, invariant 14). docs/RELIABILITY.md ("The state matrix") describes the
// cells, the exclusions and how to run each tier and replay a seed.
//
// `go test ./testkit/matrix/` runs a sample of cells chosen by a seed it logs
// (IDEMFLOW_MATRIX_SEED replays it); IDEMFLOW_NIGHTLY=1 runs every cell.
//
// This package imports idemflow's workflow, phases, idemhttp, store and idemflowtest
// packages and the test kit's pgtest and childproc.
package matrix
