package sweeper

import (
	"cmp"
	"context"
	"log/slog"
	"time"
)

// Defaults for Config.
const (
	IntervalDefault     = time.Second
	GraceDefault        = 5 * time.Second
	BatchSizeDefault    = 100
	ConcurrencyDefault  = 4
	MaxAttemptsDefault  = 10
	RetentionDefault    = 24 * time.Hour
	CleanupBatchDefault = 1000
	CleanupShareDefault = 0.5
	// DeadRetentionDefault is how long a dead-lettered key is kept: 90 days.
	DeadRetentionDefault = 90 * 24 * time.Hour
	// ParkedRetentionDefault is how long a parked key is kept after its claim: 30 days.
	ParkedRetentionDefault = 30 * 24 * time.Hour
)

// Config configures an engine's sweeper (workflow.Engine.Start, Sweep). The zero value
// (or a nil *Config) means all defaults; Start and Sweep refuse an invalid one. A
// field's zero value always means its default; special values (Grace -1) are kept as
// written by WithDefaults, so applying it again changes nothing.
type Config struct {
	// Interval is the pause between passes, jittered by ±20% so that many sweepers do
	// not move in lockstep. A pass that took a full batch is followed by the next one at
	// once. Defaults to 1s; at least 1ms.
	Interval time.Duration
	// Grace leaves keys claimed less than Grace ago (by the database clock) alone, so
	// that the client's own retry usually wins. Defaults to 5s. -1 means no grace;
	// other negative values are refused.
	Grace time.Duration
	// BatchSize is the most keys one pass takes over. Defaults to 100; 1..10000.
	BatchSize int
	// Concurrency is how many taken keys are run at once. Defaults to 4; 1..1024.
	Concurrency int
	// MaxAttempts is how many attempts a key gets (its claim and every takeover count)
	// before a failed one dead-letters it. Defaults to 10; at least 1.
	MaxAttempts int
	// Retention is how long a finished key is remembered and replayed, at least, after
	// it finished. Defaults to 24h; at least one minute. On a partitioned key table
	// (docs/PARTITIONS.md) it counts from the key's creation: a partition is removed
	// once its newest possible row is Retention old and it holds no unfinished or
	// dead-lettered key.
	Retention time.Duration
	// DeadRetention is how long a dead-lettered key is kept after it was dead-lettered
	// (by the database clock), listed and ready to be re-driven; then it is deleted
	// like an expired finished key, and a retry with its key starts a new operation.
	// Defaults to 90 days; at least one minute. -1 keeps dead-lettered keys forever.
	DeadRetention time.Duration
	// ParkedRetention is how long a parked key (one of a client-only flow, such as
	// idemhttp's middlewares', that its client left unfinished) is kept after its claim;
	// then it is deleted, and a retry with its key starts a new operation. Defaults to
	// 30 days; at least one minute. -1 keeps parked keys forever.
	ParkedRetention time.Duration
	// CleanupBatch is the most expired keys deleted by one statement. Defaults to 1000;
	// 1..100000.
	CleanupBatch int
	// CleanupShare is the share of its time a cleanup of a backlog spends deleting:
	// after each full batch it rests for as long as the batch took, times
	// (1-CleanupShare)/CleanupShare, so that a large backlog does not take a whole
	// core from live traffic. Defaults to 0.5 (rest as long as the batch took); 1
	// deletes batches back to back; in (0, 1].
	CleanupShare float64
	// Hooks observe passes. Optional.
	Hooks Hooks
	// Logger receives the background loop's failures and dead-lettered keys. Defaults
	// to the engine's workflow.Config.Logger (filled in by Start and Sweep, not by
	// WithDefaults).
	Logger *slog.Logger
}

// Hooks observe an engine's sweeper. Every field is optional; hooks must be safe for concurrent
// use. Per-key events go through the engine's workflow.Hooks.Key.
type Hooks struct {
	// Pass runs after every pass, from workflow.Engine.Sweep or the background loop, with its counts
	// (Stats.Expired is the number of finished keys deleted) and its error.
	Pass func(ctx context.Context, s Stats, err error)
}

// WithDefaults returns a copy of c with zero fields set to their defaults. Special
// values are kept as they are, so c.WithDefaults().WithDefaults() equals
// c.WithDefaults().
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	out.Interval = cmp.Or(out.Interval, IntervalDefault)
	out.Grace = cmp.Or(out.Grace, GraceDefault)
	out.BatchSize = cmp.Or(out.BatchSize, BatchSizeDefault)
	out.Concurrency = cmp.Or(out.Concurrency, ConcurrencyDefault)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, MaxAttemptsDefault)
	out.Retention = cmp.Or(out.Retention, RetentionDefault)
	out.CleanupBatch = cmp.Or(out.CleanupBatch, CleanupBatchDefault)
	out.CleanupShare = cmp.Or(out.CleanupShare, CleanupShareDefault)
	out.DeadRetention = cmp.Or(out.DeadRetention, DeadRetentionDefault)
	out.ParkedRetention = cmp.Or(out.ParkedRetention, ParkedRetentionDefault)
	return &out
}

// Stats counts what one pass did.
type Stats struct {
	// Taken is the number of keys taken over.
	Taken int
	// Finished keys were driven to finished.
	Finished int
	// Released keys failed their attempt and are due again after a backoff. Keys this
	// build cannot run (written by a newer build: workflow.ErrNewerFormat) are not
	// taken; should one be taken all the same, it is given back unrun and counted here.
	Released int
	// Parked keys are of a client-only flow (the HTTP middleware's): released, not run,
	// for their client's retry; sweeps leave them alone for Config.Retention.
	Parked int
	// DeadLettered keys failed their last allowed attempt.
	DeadLettered int
	// LeaseLost keys were taken over by another executor while this pass ran them.
	LeaseLost int
	// GivenBack keys were taken but returned unrun: the sweeper was stopping, or too
	// little of the lease was left when a worker got to them.
	GivenBack int
	// Expired is the number of finished keys deleted by retention.
	Expired int64
	// ExpiredDead and ExpiredParked are the numbers of dead-lettered and parked keys
	// deleted at the end of their retention (Config.DeadRetention, ParkedRetention).
	ExpiredDead   int64
	ExpiredParked int64
	// Partitions is what the pass did to a partitioned key table.
	Partitions PartitionStats
}
