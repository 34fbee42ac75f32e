// Package workflow is idemflow's engine: it registers flows, runs a request's phases
// under its idempotency key, replays finished keys, answers in-progress and mismatched
// attempts, takes over keys whose lease ended and resumes them from their recovery point.
//
// Usage:
//
//	engine, err := workflow.New(pool, nil) // nil *Config: all defaults
//	if err != nil {
//		return err
//	}
//	if err := engine.Register(chargeFlow); err != nil {
//		return err
//	}
//
//	res, err := engine.Do(ctx, workflow.Request{
//		Scope: accountID, Key: r.Header.Get("Idempotency-Key"),
//		Flow: "create_charge", Method: "POST", Route: "/v1/charges", Body: body,
//	})
//	switch {
//	case err == nil:
//		// res.Response is the answer; res.Replayed says whether it was stored earlier.
//	case errors.Is(err, workflow.ErrInProgress):
//		// 409; err.(*workflow.InProgressError).RetryAfter says when to come back.
//	case errors.Is(err, workflow.ErrMismatch):
//		// 422: the key was used for a different request.
//	case errors.Is(err, workflow.ErrTransient):
//		// 503: nothing stored; the work resumes on the next attempt or sweep.
//	}
//
// Package idemhttp puts this behind net/http (idemhttp.Handler for a registered flow,
// idemhttp.Middleware and idemhttp.TxMiddleware for any plain handler); this package
// has no net/http code and does not import it.
//
// Deployment. The engine holds no session state and works in every pgx query exec
// mode; behind a pooler in transaction mode that keeps no prepared statements
// (pgbouncer before 1.21), give the pool default_query_exec_mode=cache_describe, or
// its statements fail with ErrMisconfigured, whose message says so. Config.Schema puts
// the key table in a named schema that every statement names, without search_path.
//
// Client-only flows. A flow marked phases.Flow.ClientOnly (idemhttp's middlewares'
// flows) is registered by the names and kinds of its phases; each attempt brings the
// functions in Request.ClientPhases, closing over what only it has. Such a key is run
// only by an attempt that brings them: Do without them and Resume fail with
// ErrNeedsClient, and a sweeper parks the key for its client's retry.
//
// The claim. A new key is claimed in one round trip before any of its flow's code runs:
// BEGIN, a transaction-scoped advisory lock on the key taken without waiting, and a
// look-up of the key row in a fresh snapshot. An attempt that does not get the key
// (another attempt is in the key's first transaction, or the row exists) runs no
// statement and no Go code of the flow and is answered at once: 409 while the key is
// being claimed, else as the row says (replay, 409, 422). The key row is inserted, with
// its recovery point already set, in the same round trip as the first tx phase's
// COMMIT. A tx phase at REPEATABLE READ or SERIALIZABLE reads one snapshot for all its
// statements, so for it the claim inserts the row with the lock instead, and the commit
// advances it. Tx phases run at READ COMMITTED unless phases.Phase.IsoLevel says
// otherwise.
//
// The transaction a tx phase gets is also a pgx.Tx (see phases.DBTX and the pgxTx
// example): Begin opens a savepoint, which rides in the round trip of the phase's BEGIN
// when it is the phase's first statement, except in a new key's first tx phase, whose
// transaction the claim has already begun (there it is a round trip of its own); Commit
// and Rollback of the phase's own transaction, and any statement text that ends or
// begins it (COMMIT, ROLLBACK, END, BEGIN, ...), are refused with phases.ErrTxManaged
// before anything is sent, and fail the phase.
//
// Cost of a fresh request: one round trip to look the key up and one for the claim,
// then per tx phase one commit, the engine's write of the key row pipelined with
// COMMIT. A replay is one round trip. No transaction is open while a call phase runs.
//
// Bounded wait. An attempt with Request.Wait set that finds its key held by a live
// attempt, or being claimed, waits up to that long for the holder's answer instead of
// failing with *InProgressError at once, holding no connection and waiting on no
// lock; it then replays the answer, or takes the key over if the holder released it
// (a transient failure), or, when the bound passes, fails with *InProgressError as
// without a wait. When the holder runs in the same engine, its end wakes the waiters
// and nothing is sent while it runs; else one poller per key and engine sends the
// ordinary look-up, paced from the flow's observed answer time and backing off with
// jitter, for all that key's waiters. A waiter sends at most 8 statements for its
// whole wait, whatever its bound. Config.MaxWaiters caps the waiters; OutcomeWaiting
// reports each wait. No LISTEN/NOTIFY and no session state: it works behind a pooler
// in transaction mode and on Citus.
//
// Observing and operating. Hooks observe attempts (AttemptStart, AttemptEnd with the
// key row's id, attempt number, executor and outcome), phases and key events; several
// observers combine with JoinHooks (package otelidemflow is one). Each key keeps a
// bounded history of its attempts (Attempt, Config.History), written by the statements
// that end them, at no extra round trip or commit. One vocabulary, Outcome, names how
// an attempt ended and every key event, history entry and metric.
//
// The operator's API, all on Engine and in the admin*.go files and cancel.go: list
// (ListKeys), show a key with its history (InspectKey), re-drive (Redrive), release
// (ReleaseKey), cancel with an answer, running the flow's compensation
// (phases.Flow.Compensation) in the cancel's transaction (CancelKey, and PreviewCancel
// to say what it will run), purge (PurgeKey), bulk re-drive and release
// (BulkKeys), erase a scope (EraseScope), and counts (CountKeys, GaugeKeys,
// CountOutcomes). An action that refuses a key in the wrong status returns
// ErrWrongStatus. cmd/idemflow, package idemflowui and docs/OPERATIONS.md are built on
// it.
//
// The sweeper. Start runs the engine's sweeper in the background until Stop; Sweep runs
// one pass. It takes over keys whose lease ended and that are due, runs them from their
// recovery point through the same phase code a retry runs, dead-letters the ones whose
// attempts ran out, and expires old keys and partitions. Run it in every process with
// an engine, servers and workers alike. Its settings are Config.Sweeper (a
// SweeperConfig), its report a SweepStats; package sweeper documents what a pass does.
// A pass runs the maintenance services of internal/maintenance.
//
// This package imports idemflow's phases and store packages, internal/attempt (the
// executor of one attempt) and internal/maintenance (the sweeper's services), both
// handed values, never the Engine, internal/keytable (the key table's driver),
// internal/fingerprint (a request's fingerprint, under Fingerprint) and
// internal/vocab (the engine's vocabulary: outcomes, results, events, errors and their
// classes, which this package re-exports as aliases), and of other modules only pgx.
// It does not import net/http (header names are canonicalised with net/textproto);
// phases.Response.Header is an http.Header, so net/http is among its dependencies
// through phases.
package workflow
