package workflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/sweeper"
)

// The engine's sweeper: a background loop (Start, Stop) or one pass (Sweep) that takes
// over stuck keys, runs them through maintenance (sweep.go), and expires old keys.
// Package sweeper holds its settings and what it reports, and documents its behaviour.

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

// sweep is one sweeper of an engine, with its settings (defaults filled in).
type sweep struct {
	e   *Engine
	m   maintenance
	cfg *sweeper.Config
}

// newSweep checks cfg and returns a sweeper of e with it.
func (e *Engine) newSweep(cfg *sweeper.Config) (*sweep, error) {
	c := cfg.WithDefaults()
	if err := validateSweep(c); err != nil {
		return nil, err
	}
	if c.Logger == nil {
		c.Logger = e.cfg.Logger
	}
	return &sweep{e: e, m: maintenance{e}, cfg: c}, nil
}

func validateSweep(c *sweeper.Config) error {
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

// Start runs the engine's sweeper in the background until Stop, and returns at once:
// passes that take over keys whose client went away and finish them, and expire old
// keys (package sweeper documents what a pass does; cfg may be nil: all defaults). The
// first pass starts immediately. Run it in every process with an engine that should
// finish keys, servers and workers alike: any number of sweepers may run at once, in
// any number of processes, against the same database. Ending ctx stops the loop like
// Stop does, without waiting: no more keys are taken, and keys in flight finish their
// run. It fails, starting nothing, if cfg is invalid; else Start on an engine whose
// sweeper runs does nothing (the running one keeps its settings).
func (e *Engine) Start(ctx context.Context, cfg *sweeper.Config) error {
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

// Sweep runs one pass of a sweeper with cfg (nil: all defaults) synchronously: for
// tests, operators and jobs that schedule passes themselves. It takes over up to
// cfg.BatchSize due keys, runs them (cfg.Concurrency at a time) until each is finished,
// released, parked or dead-lettered, then deletes expired keys until none is left and
// maintains a partitioned key table. The error joins the failures of the pass (taking
// keys, recording a key's fate, the cleanup, ctx ending), or is cfg's if it is
// invalid; sweeper.Stats counts what was done regardless. A key's failed attempt is not
// an error of the pass: it is counted in Stats.Released or Stats.DeadLettered. Sweep
// runs independently of Start and Stop; only ctx bounds it.
func (e *Engine) Sweep(ctx context.Context, cfg *sweeper.Config) (sweeper.Stats, error) {
	sw, err := e.newSweep(cfg)
	if err != nil {
		return sweeper.Stats{}, err
	}
	return sw.pass(ctx, nil)
}

// run is the background loop.
func (s *sweep) run(ctx context.Context, stop <-chan struct{}) {
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

// pass takes due keys, runs them and cleans up. stop (nil for Sweep) tells it to
// start nothing new.
func (s *sweep) pass(ctx context.Context, stop <-chan struct{}) (sweeper.Stats, error) {
	var st sweeper.Stats
	var errs []error
	if !stopped(ctx, stop) {
		keys, err := s.m.TakeDue(ctx, takeDueOpts{Limit: s.cfg.BatchSize, Grace: s.cfg.Grace})
		if err != nil {
			errs = append(errs, fmt.Errorf("take due keys: %w", err))
		}
		st.Taken = len(keys)
		errs = append(errs, s.runTaken(ctx, stop, keys, &st)...)
	}
	for _, c := range []struct {
		name      string
		retention time.Duration
		expire    func(context.Context, time.Duration, int) (int64, error)
		count     *int64
	}{
		{"finished", s.cfg.Retention, s.m.ExpireFinished, &st.Expired},
		{"dead-lettered", s.cfg.DeadRetention, s.m.ExpireDead, &st.ExpiredDead},
		{"parked", s.cfg.ParkedRetention, s.m.ExpireParked, &st.ExpiredParked},
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
		if err := s.maintainPartitions(ctx, &st); err != nil {
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
func (s *sweep) runTaken(ctx context.Context, stop <-chan struct{}, keys []*taken, st *sweeper.Stats) []error {
	if len(keys) == 0 {
		return nil
	}
	queue := make(chan *taken, len(keys))
	for _, t := range keys {
		queue <- t
	}
	close(queue)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range min(s.cfg.Concurrency, len(keys)) {
		wg.Go(func() {
			for t := range queue {
				if stopped(ctx, stop) || t.LeaseLeft() < s.e.cfg.Lease/2 {
					err := s.m.GiveBack(ctx, t)
					mu.Lock()
					st.GivenBack++
					if err != nil {
						errs = append(errs, fmt.Errorf("give back key %q: %w", t.Key, err))
					}
					mu.Unlock()
					continue
				}
				res, err := s.m.Run(ctx, t, &runOpts{MaxAttempts: s.cfg.MaxAttempts, ParkFor: s.cfg.Retention})
				s.logFate(ctx, t, res)
				mu.Lock()
				count(st, res.Outcome)
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

// count adds a swept key's outcome to st.
func count(st *sweeper.Stats, o Outcome) {
	switch o {
	case OutcomeFinished:
		st.Finished++
	case OutcomeReleased:
		st.Released++
	case OutcomeDeadLettered:
		st.DeadLettered++
	case OutcomeLeaseLost:
		st.LeaseLost++
	case OutcomeParked:
		st.Parked++
	}
}

// logFate logs a key the sweeper finished, parked or dead-lettered: its id, scope,
// client key, flow and the recovery point it was resumed from, never its body or
// response. A dead-lettered key is a warning with its last error.
func (s *sweep) logFate(ctx context.Context, t *taken, res Result) {
	level, msg := slog.LevelInfo, ""
	switch res.Outcome {
	case OutcomeFinished:
		msg = "sweeper: key finished"
	case OutcomeParked:
		msg = "sweeper: key parked"
	case OutcomeDeadLettered:
		level, msg = slog.LevelWarn, "sweeper: key dead-lettered"
	default:
		return
	}
	attrs := []slog.Attr{
		slog.Group("key", slog.String("id", t.ID), slog.String("scope", t.Scope), slog.String("key", t.Key)),
		slog.String("flow", t.Flow), slog.String("recovery_point", t.RecoveryPoint), slog.Int("attempts", t.Attempts),
	}
	if res.Outcome == OutcomeDeadLettered {
		attrs = append(attrs, slog.Any("err", res.Err))
	}
	s.cfg.Logger.LogAttrs(ctx, level, msg, attrs...)
}

// cleanup deletes expired keys of one kind (what's name) with expire in batches until
// one comes back short, resting between full batches so that it spends
// Config.CleanupShare of its time deleting.
func (s *sweep) cleanup(ctx context.Context, stop <-chan struct{}, what string, retention time.Duration,
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
			rest := s.e.sweeping.rest
			if rest == nil {
				rest = restFor
			}
			rest(ctx, stop, time.Duration(float64(took)*(1-s.cfg.CleanupShare)/s.cfg.CleanupShare))
		}
	}
	return total, nil
}

// restFor waits d, or until stop is closed or ctx ends.
func restFor(ctx context.Context, stop <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	case <-ctx.Done():
	}
}

// maintainPartitions runs the partition maintenance step of a pass, if the key table
// is partitioned. Retention counts from a key's creation on this layout: a partition
// is removed once its newest possible row is Config.Retention old.
func (s *sweep) maintainPartitions(ctx context.Context, st *sweeper.Stats) error {
	r, err := s.m.MaintainPartitions(ctx, s.cfg.Retention)
	if errors.Is(err, store.ErrNotPartitioned) {
		return nil
	}
	st.Partitions = sweeper.PartitionStats{Ahead: r.Ahead, Created: r.Created, Removed: r.Removed, Kept: r.Kept,
		Removal: r.Removal, DropLock: r.DropLock, Stall: r.Stall}
	if r.Removed > 0 {
		s.cfg.Logger.InfoContext(ctx, "sweeper: removed key table partitions",
			slog.Int("removed", r.Removed), slog.Int("kept", r.Kept), slog.Duration("took", r.Removal),
			slog.Duration("drop_lock", r.DropLock), slog.Duration("stall", r.Stall))
	}
	warned := &s.e.sweeping.warned
	switch {
	case r.Low() && !warned.Swap(true):
		s.cfg.Logger.WarnContext(ctx, "sweeper: few key table partitions ahead",
			slog.Int("ahead", r.Ahead), slog.Int("want", r.Want))
	case !r.Low() && r.Want > 0:
		warned.Store(false)
	}
	if err != nil {
		return fmt.Errorf("maintain partitions: %w", err)
	}
	return nil
}
