// Package sweeper finishes idemflow keys whose client went away and expires finished
// keys after their retention. Embed it in any process that has an engine with the
// flows registered; any number of sweepers may run at once, in any number of
// processes, against the same database.
//
// Usage:
//
//	sw, err := sweeper.New(engine, nil) // nil *Config: all defaults
//	if err != nil {
//		return err
//	}
//	if err := sw.Start(ctx); err != nil { // returns at once
//		return err
//	}
//	<-done // until the process shuts down
//	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//	defer cancel()
//	if err := sw.Stop(stopCtx); err != nil { // lets in-flight keys finish, returns the rest
//		return err
//	}
//
//	stats, err := sw.RunOnce(ctx) // one pass, synchronously: for tests and operators
//
// Each pass takes over, in short statements with FOR UPDATE SKIP LOCKED, up to
// Config.BatchSize keys that are in progress with an expired or released lease, due
// (their backoff has passed) and older than Config.Grace, bumping each one's lock
// version so that whatever ran it before can no longer commit. It runs them,
// Config.Concurrency at a time, through the engine from their recovery point: the same
// phase code a client's retry runs, with the request stored on the key. A failed
// attempt releases the key with an exponential backoff (the engine's BackoffBase and
// BackoffMax); once a key has had Config.MaxAttempts attempts and fails again it is
// dead-lettered: visible with its last error, never run again until
// workflow.Engine.Redrive. Keys of client-only flows (the HTTP middleware's) are
// parked: released, not run, so that the client's next retry runs them afresh; they are never
// dead-lettered by a sweeper, and are looked at again only after Config.Retention.
//
// # Retention
//
// A finished key is remembered, and replayed to every retry with the same key, for at
// least Config.Retention after it finished: 24 hours by default. Each pass deletes
// finished keys older than that, oldest first, in batches of Config.CleanupBatch rows
// per short statement that skips rows anyone else has locked, until a batch comes back
// short; live traffic is never blocked by it. A finished key past its retention is
// still replayed until the cleanup deletes it; a retry after that is a new request.
// Clients should not retry a request with the same key after the retention window.
// Keys in progress and dead-lettered keys are never expired.
//
// A sweeper works on its engine's key table: in the schema of the engine's
// workflow.Config.Schema, so it has no schema setting of its own and cannot disagree
// with the engine about where the keys are.
//
// # Events
//
// Per-key events go through the engine's workflow.Hooks.Key: OutcomeSwept when a sweeper
// takes a key over; then the outcome of its attempt: OutcomeFinished, OutcomeReleased
// (a failed attempt; Err says why), OutcomeParked (a client-only key released for its
// client; Err says why), OutcomeLeaseLost or OutcomeDeadLettered; OutcomeGivenBack (taken
// but returned unrun when stopping), and OutcomeRedriven from workflow.Engine.Redrive.
// Per-pass counts, including the number of keys expired, go to Config.Hooks.Pass.
// Failures of the background loop and dead-lettered keys are logged through
// Config.Logger.
//
// This package imports idemflow's workflow package; the engine hands a sweeper its
// maintenance calls as a typed value (workflow.Engine.Maintenance), which services
// never call themselves.
package sweeper
