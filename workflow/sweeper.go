package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/internal/maintenance"
	"github.com/idemflow/idemflow/store"
)

// The engine's sweeper: its settings (SweeperConfig, on Config.Sweeper), its report
// (SweepStats), and the loop (Start, Stop) or single pass (Sweep) that runs the
// maintenance services (internal/maintenance: take over, expire, partitions) in turn.

// Defaults of SweeperConfig.
const (
	SweepIntervalDefault    = time.Second
	SweepGraceDefault       = maintenance.GraceDefault
	SweepBatchSizeDefault   = maintenance.BatchSizeDefault
	SweepConcurrencyDefault = maintenance.ConcurrencyDefault
	SweepMaxAttemptsDefault = maintenance.MaxAttemptsDefault
	// RetentionDefault is how long a finished key is remembered: 24 hours.
	RetentionDefault    = maintenance.RetentionDefault
	CleanupBatchDefault = maintenance.CleanupBatchDefault
	CleanupShareDefault = maintenance.CleanupShareDefault
	// DeadRetentionDefault is how long a dead-lettered key is kept: 90 days.
	DeadRetentionDefault = maintenance.DeadRetentionDefault
	// ParkedRetentionDefault is how long a parked key is kept after its claim: 30 days.
	ParkedRetentionDefault = maintenance.ParkedRetentionDefault
)

// SweeperConfig configures an engine's sweeper: Config.Sweeper, or the one given to
// Engine.Start or Sweep. The zero value means all defaults; New, Start and Sweep refuse
// an invalid one. A field's zero value always means its default; special values (Grace
// -1) are kept as written by WithDefaults, so applying it again changes nothing.
type SweeperConfig struct {
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
	// PartitionRemoval is when, on a partitioned key table (docs/PARTITIONS.md), a pass
	// may remove the partitions past Retention: a daily window of the database clock,
	// in UTC. The zero value is any time. Outside it a pass still creates partitions
	// ahead. A removal's drop slows the live requests that overlap it (tens of
	// milliseconds per half gigabyte of partition, measured), and on Citus its detach
	// makes every statement on the key table wait for it: a window puts it at the
	// service's quietest hour. A partition waits up to a day for the window, its keys
	// replayed meanwhile (the batched expiry leaves them to the removal for that day).
	// A window shorter than Interval may be passed over.
	PartitionRemoval DailyWindow
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
	Hooks SweeperHooks
	// Logger receives the background loop's failures and dead-lettered keys. Defaults
	// to the engine's Config.Logger (filled in by Start and Sweep, not by WithDefaults).
	Logger *slog.Logger
}

// SweeperHooks observe an engine's sweeper. Every field is optional; hooks must be safe
// for concurrent use. Per-key events go through the engine's Hooks.Key.
type SweeperHooks struct {
	// Pass runs after every pass, from Engine.Sweep or the background loop, with its
	// counts (SweepStats.Expired is the number of finished keys deleted) and its error.
	Pass func(ctx context.Context, s SweepStats, err error)
}

// WithDefaults returns a copy of c with zero fields set to their defaults. Special
// values are kept as they are, so c.WithDefaults().WithDefaults() equals
// c.WithDefaults().
func (c *SweeperConfig) WithDefaults() *SweeperConfig {
	out := SweeperConfig{}
	if c != nil {
		out = *c
	}
	out.Interval = cmp.Or(out.Interval, SweepIntervalDefault)
	out.Grace = cmp.Or(out.Grace, SweepGraceDefault)
	out.BatchSize = cmp.Or(out.BatchSize, SweepBatchSizeDefault)
	out.Concurrency = cmp.Or(out.Concurrency, SweepConcurrencyDefault)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, SweepMaxAttemptsDefault)
	out.Retention = cmp.Or(out.Retention, RetentionDefault)
	out.CleanupBatch = cmp.Or(out.CleanupBatch, CleanupBatchDefault)
	out.CleanupShare = cmp.Or(out.CleanupShare, CleanupShareDefault)
	out.DeadRetention = cmp.Or(out.DeadRetention, DeadRetentionDefault)
	out.ParkedRetention = cmp.Or(out.ParkedRetention, ParkedRetentionDefault)
	return &out
}

func (c *SweeperConfig) validate() error {
	switch {
	case c.Interval < time.Millisecond:
		return fmt.Errorf("sweeper: Interval %s is under 1ms", c.Interval)
	case c.Grace < -1:
		return fmt.Errorf("sweeper: Grace %s is negative; -1 means no grace", c.Grace)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("sweeper: BatchSize %d is outside 1..10000", c.BatchSize)
	case c.Concurrency < 1 || c.Concurrency > 1024:
		return fmt.Errorf("sweeper: Concurrency %d is outside 1..1024", c.Concurrency)
	case c.MaxAttempts < 1:
		return fmt.Errorf("sweeper: MaxAttempts %d is under 1", c.MaxAttempts)
	case c.Retention < time.Minute:
		return fmt.Errorf("sweeper: Retention %s is under 1m", c.Retention)
	case c.DeadRetention != -1 && c.DeadRetention < time.Minute:
		return fmt.Errorf("sweeper: DeadRetention %s is under 1m; -1 keeps dead-lettered keys forever", c.DeadRetention)
	case c.ParkedRetention != -1 && c.ParkedRetention < time.Minute:
		return fmt.Errorf("sweeper: ParkedRetention %s is under 1m; -1 keeps parked keys forever", c.ParkedRetention)
	case c.CleanupBatch < 1 || c.CleanupBatch > 100000:
		return fmt.Errorf("sweeper: CleanupBatch %d is outside 1..100000", c.CleanupBatch)
	case !(c.CleanupShare > 0 && c.CleanupShare <= 1):
		return fmt.Errorf("sweeper: CleanupShare %g is outside (0, 1]", c.CleanupShare)
	}
	if err := c.PartitionRemoval.validate(); err != nil {
		return fmt.Errorf("sweeper: PartitionRemoval: %w", err)
	}
	return nil
}

// SweepStats counts what one pass did.
type SweepStats struct {
	// Taken is the number of keys taken over.
	Taken int
	// Finished keys were driven to finished.
	Finished int
	// Released keys failed their attempt and are due again after a backoff. Keys this
	// build cannot run (written by a newer build: ErrNewerFormat) are not taken; should
	// one be taken all the same, it is given back unrun and counted here.
	Released int
	// Parked keys are of a client-only flow (the HTTP middleware's): released, not run,
	// for their client's retry; sweeps leave them alone for SweeperConfig.Retention.
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
	// deleted at the end of their retention (SweeperConfig.DeadRetention,
	// ParkedRetention).
	ExpiredDead   int64
	ExpiredParked int64
	// Partitions is what the pass did to a partitioned key table (docs/PARTITIONS.md);
	// all zero when the key table is not partitioned. Ahead is the metric to watch: the
	// sweeper logs a warning when fewer than half of the default (Want) exist, as a
	// claim whose creation time has no partition fails (retryably).
	Partitions store.PartitionReport
}

// sweeping is an engine's sweeper state.
type sweeping struct {
	mu   sync.Mutex
	loop *loop // the running background loop, nil when stopped

	warned atomic.Bool // the low-partitions warning was logged and not cleared since

	stopping func() // test hook: runs in Stop after the loop was told to stop
	// rest waits d or until stop or ctx; tests replace it to see the cleanup's pace.
	rest func(ctx context.Context, stop <-chan struct{}, d time.Duration)
}

// loop is one run of the background loop, from Start to Stop.
type loop struct {
	stop     chan struct{} // closed when the loop must take nothing more
	stopOnce sync.Once
	cancel   context.CancelFunc // ends the work in flight
	done     chan struct{}      // closed when the loop has returned
}

func (l *loop) signalStop() { l.stopOnce.Do(func() { close(l.stop) }) }

// sweep is one sweeper of an engine: its settings (defaults filled in) and the
// maintenance services a pass runs, in this order.
type sweep struct {
	cfg         *SweeperConfig
	takeover    *maintenance.Takeover
	expirer     *maintenance.Expirer
	partitioner *maintenance.Partitioner
}

// newSweep checks cfg (nil: the engine's Config.Sweeper) and returns a sweeper of e
// with it.
func (e *Engine) newSweep(cfg *SweeperConfig) (*sweep, error) {
	if cfg == nil {
		cfg = &e.cfg.Sweeper
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	c.Logger = cmp.Or(c.Logger, e.cfg.Logger)
	env := &maintenance.Env{Store: e.store, Pool: e.pool, StatementTimeout: e.cfg.Lease, Logger: c.Logger}
	return &sweep{
		cfg:      c,
		takeover: e.takeoverService(env, c),
		expirer: &maintenance.Expirer{Env: env, ClientOnly: e.clientOnlyFlows, Rest: e.sweeping.rest,
			Config: maintenance.ExpirerConfig{Finished: c.Retention, Dead: c.DeadRetention, Parked: c.ParkedRetention,
				Batch: c.CleanupBatch, Share: c.CleanupShare, RemovalWait: removalWait(c.PartitionRemoval)}},
		partitioner: &maintenance.Partitioner{Env: env, Warned: &e.sweeping.warned,
			Config: maintenance.PartitionerConfig{Retention: c.Retention, RemoveAt: c.PartitionRemoval.Contains}},
	}, nil
}

// removalWait is how long a partition past its removal may wait for w: a day with a
// window (the expiry then leaves its keys to the removal that long), none without.
func removalWait(w DailyWindow) time.Duration {
	if w == (DailyWindow{}) {
		return 0
	}
	return 24 * time.Hour
}

// Start runs the engine's sweeper in the background until Stop, and returns at once:
// passes that take over keys whose client went away and finish them, and expire old
// keys (package sweeper documents what a pass does; cfg nil: the engine's
// Config.Sweeper). The first pass starts immediately. Run it in every process with an
// engine that should finish keys, servers and workers alike: any number of sweepers
// may run at once, in any number of processes, against the same database. Ending ctx
// stops the loop like Stop does, without waiting: no more keys are taken, and keys in
// flight finish their run. It fails, starting nothing, if cfg is invalid; else Start on
// an engine whose sweeper runs does nothing (the running one keeps its settings).
func (e *Engine) Start(ctx context.Context, cfg *SweeperConfig) error {
	sw, err := e.newSweep(cfg)
	if err != nil {
		return err
	}
	s := &e.sweeping
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loop != nil {
		select {
		case <-s.loop.done: // ended with its context; start afresh
		default:
			return nil
		}
	}
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &loop{stop: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	s.loop = l
	unhook := context.AfterFunc(ctx, l.signalStop)
	go func() {
		defer close(l.done)
		defer cancel()
		defer unhook()
		sw.run(work, l.stop)
	}()
	return nil
}

// Stop stops the engine's sweeper: no more keys are taken, keys being run finish their
// run, and keys taken but not yet started are released at once for any sweeper to
// take. It waits for that until ctx ends; then it cancels the runs still in flight
// (they release their keys, as after any failure), waits for them to unwind, and
// returns ctx's error. Stop is idempotent, and a no-op when the sweeper is not
// running. In a shutdown, call it before Drain.
func (e *Engine) Stop(ctx context.Context) error {
	s := &e.sweeping
	s.mu.Lock()
	l := s.loop
	s.loop = nil
	s.mu.Unlock()
	if l == nil {
		return nil
	}
	l.signalStop()
	if s.stopping != nil {
		s.stopping()
	}
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		l.cancel()
		<-l.done
		return ctx.Err()
	}
}

// Sweep runs one pass of a sweeper with cfg (nil: the engine's Config.Sweeper)
// synchronously: for tests, operators and jobs that schedule passes themselves. It
// takes over up to cfg.BatchSize due keys, runs them (cfg.Concurrency at a time) until
// each is finished, released, parked or dead-lettered, then deletes expired keys until
// none is left and maintains a partitioned key table. The error joins the failures of
// the pass (taking keys, recording a key's fate, the cleanup, ctx ending), or is cfg's
// if it is invalid; SweepStats counts what was done regardless. A key's failed attempt
// is not an error of the pass: it is counted in SweepStats.Released or DeadLettered.
// Sweep runs independently of Start and Stop; only ctx bounds it.
func (e *Engine) Sweep(ctx context.Context, cfg *SweeperConfig) (SweepStats, error) {
	sw, err := e.newSweep(cfg)
	if err != nil {
		return SweepStats{}, err
	}
	return sw.pass(ctx, nil)
}

// run is the background loop.
func (s *sweep) run(ctx context.Context, stop <-chan struct{}) {
	log := s.cfg.Logger
	for {
		st, err := s.pass(ctx, stop)
		if err != nil && ctx.Err() == nil {
			log.ErrorContext(ctx, "sweeper: pass failed", slog.Any("err", err))
		}
		if st.Expired > 0 {
			log.InfoContext(ctx, "sweeper: expired finished keys",
				slog.Int64("count", st.Expired), slog.Duration("retention", s.cfg.Retention))
		}
		if st.ExpiredDead > 0 || st.ExpiredParked > 0 {
			log.InfoContext(ctx, "sweeper: expired unfinished keys",
				slog.Int64("dead_lettered", st.ExpiredDead), slog.Duration("dead_retention", s.cfg.DeadRetention),
				slog.Int64("parked", st.ExpiredParked), slog.Duration("parked_retention", s.cfg.ParkedRetention))
		}
		wait := jitter(s.cfg.Interval)
		if st.Taken >= s.cfg.BatchSize && err == nil {
			wait = 0 // more is due
		}
		t := time.NewTimer(wait)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	spread := int64(d) * 2 / 5
	if spread <= 0 {
		return d
	}
	return d - time.Duration(spread/2) + time.Duration(rand.Int64N(spread+1))
}

// pass runs the services once each: the takeover, the expiries, the partitions. stop
// (nil for Sweep) tells them to start nothing new.
func (s *sweep) pass(ctx context.Context, stop <-chan struct{}) (SweepStats, error) {
	var st SweepStats
	tk, terr := s.takeover.RunOnce(ctx, stop)
	st.Taken, st.Finished, st.Released, st.Parked = tk.Taken, tk.Finished, tk.Released, tk.Parked
	st.DeadLettered, st.LeaseLost, st.GivenBack = tk.DeadLettered, tk.LeaseLost, tk.GivenBack
	ex, xerr := s.expirer.RunOnce(ctx, stop)
	st.Expired, st.ExpiredDead, st.ExpiredParked = ex.Finished, ex.Dead, ex.Parked
	var perr error
	if !maintenance.Stopped(ctx, stop) {
		st.Partitions, perr = s.partitioner.RunOnce(ctx)
	}
	err := errors.Join(terr, xerr, perr, ctx.Err())
	if s.cfg.Hooks.Pass != nil {
		s.cfg.Hooks.Pass(ctx, st, err)
	}
	return st, err
}
