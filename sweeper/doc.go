// Package sweeper documents idemflow's sweeper: it finishes keys whose client went
// away and expires keys after their retention. The engine runs it
// (workflow.Engine.Start and Stop, workflow.Engine.Sweep for one pass), in any process
// that has an engine with the flows registered, a server's or a worker's; any number
// of sweepers may run at once, in any number of processes, against the same database.
// Its settings are the engine's: workflow.Config.Sweeper (a workflow.SweeperConfig),
// or the one given to Start or Sweep; each pass reports a workflow.SweepStats.
//
// This package's names (Config, Hooks, Stats, PartitionStats and the defaults) are
// deprecated aliases of workflow's and store's, kept for one release; a service
// does not need to import it.
//
// Usage:
//
//	if err := engine.Start(ctx, nil); err != nil { // nil: the engine's Config.Sweeper; returns at once
//		return err
//	}
//	<-done // until the process shuts down
//	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//	defer cancel()
//	if err := engine.Stop(stopCtx); err != nil { // lets in-flight keys finish, returns the rest
//		return err
//	}
//
//	stats, err := engine.Sweep(ctx, &workflow.SweeperConfig{Grace: -1}) // one pass, synchronously: for tests and operators
//
// A pass runs three maintenance services in turn (internal/maintenance, one a file):
// the takeover, the expiries and the partitions.
//
// Each pass takes over, in short statements with FOR UPDATE SKIP LOCKED, up to
// Config.BatchSize keys that are in progress with an expired or released lease, due
// (their backoff has passed) and older than Config.Grace, bumping each one's lock
// version so that whatever ran it before can no longer commit. Each statement reads
// the due keys in due order from a random point (a random fraction of the time from
// the oldest unfinished key's due time to now) and wraps around to the oldest: a lone
// sweeper reaches every due key, and sweepers taking at once, in one process or many,
// lock different keys rather than all reach for the oldest (on Citus and a partitioned
// key table, whose sweeps scan per key, each scan lists its candidates so). It runs them,
// Config.Concurrency at a time, through the engine's executor from their recovery
// point: the same phase code a client's retry runs, with the request stored on the key. A failed
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
// Dead-lettered keys are deleted the same way Config.DeadRetention after they were
// dead-lettered (90 days), and parked keys Config.ParkedRetention after their claim
// (30 days); other keys in progress are never expired.
//
// On a partitioned key table (docs/PARTITIONS.md) each pass also creates partitions
// ahead and removes those past Config.Retention that hold no unfinished or
// dead-lettered key; Stats.Partitions (a store.PartitionReport) says what it did.
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
// This package imports workflow and store, for its aliases. Package workflow does not
// import it: the loop is the engine's (workflow/sweeper.go), the services are
// internal/maintenance's, and what a taken key's run does is the executor's.
package sweeper
