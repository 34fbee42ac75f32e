// Package sweeper holds the settings (Config, Hooks) and the report (Stats) of
// idemflow's sweeper, and documents what it does: it finishes keys whose client went
// away and expires finished keys after their retention. The engine runs it
// (workflow.Engine.Start and Stop, workflow.Engine.Sweep for one pass), in any process
// that has an engine with the flows registered, a server's or a worker's; any number
// of sweepers may run at once, in any number of processes, against the same database.
// A service that keeps the defaults does not import this package.
//
// Usage:
//
//	if err := engine.Start(ctx, nil); err != nil { // nil *sweeper.Config: all defaults; returns at once
//		return err
//	}
//	<-done // until the process shuts down
//	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//	defer cancel()
//	if err := engine.Stop(stopCtx); err != nil { // lets in-flight keys finish, returns the rest
//		return err
//	}
//
//	stats, err := engine.Sweep(ctx, &sweeper.Config{Grace: -1}) // one pass, synchronously: for tests and operators
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
// # Imports
//
// This package imports no other package of idemflow: package workflow imports it, and
// its engine runs the sweeper with these settings (the loop is the engine's, in
// workflow/sweeper.go; what a pass does to a key, in workflow/sweep.go). A Config is
// checked when it is used: Engine.Start and Engine.Sweep refuse an invalid one.
package sweeper
