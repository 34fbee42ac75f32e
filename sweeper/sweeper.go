package sweeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemflow/idemflow/workflow"
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

// Config configures a Sweeper. The zero value (or a nil *Config) means all defaults. A
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
	// to the engine's Config.Logger (filled in by New, not by WithDefaults).
	Logger *slog.Logger
}

// Hooks observe a sweeper. Every field is optional; hooks must be safe for concurrent
// use. Per-key events go through the engine's workflow.Hooks.Key.
type Hooks struct {
	// Pass runs after every pass, from RunOnce or the background loop, with its counts
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

func (c *Config) validate() error {
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
	return nil
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
	// Partitions is what the pass did to a partitioned key table (partition.go).
	Partitions PartitionStats
}

func (s *Stats) add(o workflow.Outcome) {
	switch o {
	case workflow.OutcomeFinished:
		s.Finished++
	case workflow.OutcomeReleased:
		s.Released++
	case workflow.OutcomeDeadLettered:
		s.DeadLettered++
	case workflow.OutcomeLeaseLost:
		s.LeaseLost++
	case workflow.OutcomeParked:
		s.Parked++
	}
}

// Sweeper takes over and finishes stuck keys and expires old finished ones. It is safe
// for concurrent use; any number may run at once, in any number of processes.
type Sweeper struct {
	engine workflow.Maintenance
	cfg    *Config
	lease  time.Duration

	mu   sync.Mutex
	loop *loop // the running background loop, nil when stopped

	partitions partitionState // partition.go

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

// New returns a sweeper that drives keys through engine, whose flows must be
// registered (keys of flows it does not know are left to other processes). cfg may be
// nil. It fails if the configuration is invalid.
func New(engine *workflow.Engine, cfg *Config) (*Sweeper, error) {
	if engine == nil {
		return nil, errors.New("sweeper: nil engine")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	ec := engine.Config()
	if c.Logger == nil {
		c.Logger = ec.Logger
	}
	return &Sweeper{engine: engine.Maintenance(), cfg: c, lease: ec.Lease, rest: rest}, nil
}

// Start runs passes in the background until Stop, and returns at once. The first pass
// starts immediately. Ending ctx stops the loop like Stop does, without waiting: no
// more keys are taken, and keys in flight finish their run. Start on a running sweeper
// does nothing.
func (s *Sweeper) Start(ctx context.Context) error {
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
		s.run(work, l.stop)
	}()
	return nil
}

// Stop stops the background loop: no more keys are taken, keys being run finish their
// run, and keys taken but not yet started are released at once for any sweeper to
// take. It waits for that until ctx ends; then it cancels the runs still in flight
// (they release their keys, as after any failure), waits for them to unwind, and
// returns ctx's error. Stop is idempotent, and a no-op on a sweeper never started.
func (s *Sweeper) Stop(ctx context.Context) error {
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

// RunOnce runs one pass synchronously: it takes over up to Config.BatchSize due keys,
// runs them (Config.Concurrency at a time) until each is finished, released or
// dead-lettered, then deletes expired finished keys until none is left. The error
// joins the failures of the pass (taking keys, recording a key's fate, the cleanup,
// ctx ending); Stats counts what was done regardless. A key's failed attempt is not an
// error of the pass: it is counted in Stats.Released or Stats.DeadLettered. RunOnce
// runs independently of Start and Stop; only ctx bounds it.
func (s *Sweeper) RunOnce(ctx context.Context) (Stats, error) {
	return s.pass(ctx, nil)
}

// run is the background loop.
func (s *Sweeper) run(ctx context.Context, stop <-chan struct{}) {
	for {
		st, err := s.pass(ctx, stop)
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.ErrorContext(ctx, "sweeper: pass failed", slog.Any("err", err))
		}
		if st.Expired > 0 {
			s.cfg.Logger.InfoContext(ctx, "sweeper: expired finished keys",
				slog.Int64("count", st.Expired), slog.Duration("retention", s.cfg.Retention))
		}
		if st.ExpiredDead > 0 || st.ExpiredParked > 0 {
			s.cfg.Logger.InfoContext(ctx, "sweeper: expired unfinished keys",
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

func stopped(ctx context.Context, stop <-chan struct{}) bool {
	if ctx.Err() != nil {
		return true
	}
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// pass takes due keys, runs them and cleans up. stop (nil for RunOnce) tells it to
// start nothing new.
func (s *Sweeper) pass(ctx context.Context, stop <-chan struct{}) (Stats, error) {
	var st Stats
	var errs []error
	if !stopped(ctx, stop) {
		taken, err := s.engine.TakeDue(ctx, workflow.TakeDueOpts{Limit: s.cfg.BatchSize, Grace: s.cfg.Grace})
		if err != nil {
			errs = append(errs, fmt.Errorf("take due keys: %w", err))
		}
		st.Taken = len(taken)
		errs = append(errs, s.runTaken(ctx, stop, taken, &st)...)
	}
	for _, c := range []struct {
		name      string
		retention time.Duration
		expire    func(context.Context, time.Duration, int) (int64, error)
		count     *int64
	}{
		{"finished", s.cfg.Retention, s.engine.ExpireFinished, &st.Expired},
		{"dead-lettered", s.cfg.DeadRetention, s.engine.ExpireDead, &st.ExpiredDead},
		{"parked", s.cfg.ParkedRetention, s.engine.ExpireParked, &st.ExpiredParked},
	} {
		if stopped(ctx, stop) || c.retention < 0 {
			continue
		}
		n, err := s.cleanup(ctx, stop, c.name, c.retention, c.expire)
		*c.count = n
		if err != nil {
			errs = append(errs, err)
		}
	}
	if !stopped(ctx, stop) {
		if err := s.maintainPartitions(ctx, &st); err != nil { // partition.go
			errs = append(errs, err)
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	err := errors.Join(errs...)
	if s.cfg.Hooks.Pass != nil {
		s.cfg.Hooks.Pass(ctx, st, err)
	}
	return st, err
}

// runTaken runs taken keys, Config.Concurrency at a time. A key a worker gets to after
// stop, or with less than half its lease left, is given back unrun.
func (s *Sweeper) runTaken(ctx context.Context, stop <-chan struct{}, taken []*workflow.Taken, st *Stats) []error {
	if len(taken) == 0 {
		return nil
	}
	queue := make(chan *workflow.Taken, len(taken))
	for _, t := range taken {
		queue <- t
	}
	close(queue)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range min(s.cfg.Concurrency, len(taken)) {
		wg.Go(func() {
			for t := range queue {
				if stopped(ctx, stop) || t.LeaseLeft() < s.lease/2 {
					err := s.engine.GiveBack(ctx, t)
					mu.Lock()
					st.GivenBack++
					if err != nil {
						errs = append(errs, fmt.Errorf("give back key %q: %w", t.Key, err))
					}
					mu.Unlock()
					continue
				}
				res, err := s.engine.Run(ctx, t, &workflow.RunOpts{MaxAttempts: s.cfg.MaxAttempts, ParkFor: s.cfg.Retention})
				s.logFate(ctx, t, res)
				mu.Lock()
				st.add(res.Outcome)
				if err != nil {
					errs = append(errs, fmt.Errorf("record fate of key %q: %w", t.Key, err))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs
}

// logFate logs a key the sweeper finished, parked or dead-lettered: its id, scope,
// client key, flow and the recovery point it was resumed from, never its body or
// response. A dead-lettered key is a warning with its last error.
func (s *Sweeper) logFate(ctx context.Context, t *workflow.Taken, res workflow.Result) {
	level, msg := slog.LevelInfo, ""
	switch res.Outcome {
	case workflow.OutcomeFinished:
		msg = "sweeper: key finished"
	case workflow.OutcomeParked:
		msg = "sweeper: key parked"
	case workflow.OutcomeDeadLettered:
		level, msg = slog.LevelWarn, "sweeper: key dead-lettered"
	default:
		return
	}
	attrs := []slog.Attr{
		slog.Group("key", slog.String("id", t.ID), slog.String("scope", t.Scope), slog.String("key", t.Key)),
		slog.String("flow", t.Flow), slog.String("recovery_point", t.RecoveryPoint), slog.Int("attempts", t.Attempts),
	}
	if res.Outcome == workflow.OutcomeDeadLettered {
		attrs = append(attrs, slog.Any("err", res.Err))
	}
	s.cfg.Logger.LogAttrs(ctx, level, msg, attrs...)
}

// cleanup deletes expired keys of one kind (what's name) with expire in batches until
// one comes back short, resting between full batches so that it spends
// Config.CleanupShare of its time deleting.
func (s *Sweeper) cleanup(ctx context.Context, stop <-chan struct{}, what string, retention time.Duration,
	expire func(context.Context, time.Duration, int) (int64, error)) (int64, error) {
	var total int64
	for !stopped(ctx, stop) {
		began := time.Now()
		n, err := expire(ctx, retention, s.cfg.CleanupBatch)
		total += n
		if err != nil {
			return total, fmt.Errorf("expire %s keys: %w", what, err)
		}
		if n < int64(s.cfg.CleanupBatch) {
			break
		}
		if s.cfg.CleanupShare < 1 {
			took := time.Since(began)
			s.rest(ctx, stop, time.Duration(float64(took)*(1-s.cfg.CleanupShare)/s.cfg.CleanupShare))
		}
	}
	return total, nil
}

// rest waits d, or until stop is closed or ctx ends.
func rest(ctx context.Context, stop <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	case <-ctx.Done():
	}
}
