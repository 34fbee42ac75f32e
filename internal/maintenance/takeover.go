package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
)

// Defaults of TakeoverConfig (the engine's sweeper settings name them too).
const (
	BatchSizeDefault   = 100
	ConcurrencyDefault = 4
	GraceDefault       = 5 * time.Second
	MaxAttemptsDefault = 10
)

// TakeoverConfig is a Takeover's settings.
type TakeoverConfig struct {
	// BatchSize is the most keys one pass takes over. Defaults to BatchSizeDefault.
	BatchSize int
	// Concurrency is how many taken keys are run at once. Defaults to
	// ConcurrencyDefault.
	Concurrency int
	// Grace leaves keys claimed less than Grace ago (by the database clock) to their
	// client's own retry. Defaults to GraceDefault; -1 means no grace.
	Grace time.Duration
	// Run is how each taken key is run (its attempts, how long a parked key waits).
	Run RunOpts
	// Lease is the lease set on each key taken (the engine's). Required.
	Lease time.Duration
	// History is how many history entries a key keeps (the engine's; 0: off).
	History int
}

// RunOpts configure the run of one taken key.
type RunOpts struct {
	// MaxAttempts dead-letters a key whose failed attempt was its MaxAttempts-th or
	// later (Taken.Attempts counts the claim and every takeover). Defaults to
	// MaxAttemptsDefault; -1 means a key is never dead-lettered.
	MaxAttempts int
	// ParkFor is how long a parked key is left alone by sweeps. Zero: the engine's
	// BackoffMax.
	ParkFor time.Duration
}

// Attempts is o.MaxAttempts as the executor reads it: 0 for never.
func (o RunOpts) Attempts() int {
	if o.MaxAttempts < 0 {
		return 0
	}
	return cmp.Or(o.MaxAttempts, MaxAttemptsDefault)
}

// Taken is a key taken over by Takeover.TakeDue: its lock version was bumped, so
// nothing that ran it before can commit, and it holds a fresh lease. It is run with the
// Takeover's RunFunc, or given back with Takeover.GiveBack.
type Taken struct {
	Scope         string
	Key           string
	ID            string // the key row's identity
	Flow          string
	RecoveryPoint string
	LockVersion   int64
	// Attempts counts the claim and every takeover, this one included.
	Attempts int

	// Row is the key row as the takeover returned it, and At when the takeover was sent.
	Row *keytable.Row
	At  time.Time
}

// Fence is the fence of the taken key's row.
func (t *Taken) Fence() keytable.Fence {
	f := keytable.Fence{Scope: t.Scope, Key: t.Key, ID: t.ID, LockVersion: t.LockVersion}
	if t.Row != nil {
		f.CreatedAt = t.Row.CreatedAt
	}
	return f
}

// LeaseLeft estimates how much of the lease set by the takeover remains, measured from
// when the takeover was sent.
func (t *Taken) LeaseLeft() time.Duration { return t.Row.LeaseLeft() - time.Since(t.At) }

// Fate is what became of a taken key that was run.
type Fate int

// The fates of a run key, as the sweeper counts and logs them.
const (
	FateOther        Fate = iota // none of the below: not counted
	FateFinished                 // driven to finished
	FateReleased                 // a failed attempt, due again after a backoff
	FateParked                   // a client-only key, left for its client
	FateDeadLettered             // failed its last allowed attempt
	FateLeaseLost                // taken over by another executor meanwhile
)

// Ran is what a RunFunc reports of a taken key.
type Ran struct {
	Fate Fate
	Err  error // why it was released, parked or dead-lettered
}

// RunFunc runs a taken key from its recovery point through the engine's executor (the
// same phase code a client's retry runs) and reports its fate. The error is non-nil
// only when the fate could not be recorded: the lease then runs out and a later pass
// takes the key again. It is the takeover's one call into the executor.
type RunFunc func(ctx context.Context, t *Taken, opts RunOpts) (Ran, error)

// Event is a per-key event of the takeover, reported to Takeover.Event.
type Event int

const (
	EventSwept     Event = iota // a key was taken over
	EventGivenBack              // a taken key was given back unrun
)

// Takeover takes over keys whose lease ran out and runs them.
//
// The words, as everywhere in idemflow: a key is "released" by a failed attempt (its
// lease cleared, due again after a backoff), "given back" when a sweeper took it but
// did not run it (the takeover's attempt uncounted, due at once), and "parked" when
// only its client can finish it (released for the client's retry, left alone by sweeps
// for a while).
type Takeover struct {
	Env    *Env
	Config TakeoverConfig
	// Flows returns the registered flows' names, and for each the recovery points it
	// can resume from ("started" and its phases): keys at another point were written
	// by another build of the flow and are left for one that knows the point.
	Flows func() (names []string, points map[string][]string)
	// Run runs a taken key.
	Run RunFunc
	// Event, when not nil, is told of each key taken over and given back.
	Event func(ctx context.Context, ev Event, t *Taken)
}

// TakeoverStats counts what one pass of a Takeover did.
type TakeoverStats struct {
	Taken, Finished, Released, Parked, DeadLettered, LeaseLost, GivenBack int
}

// RunOnce takes over up to Config.BatchSize due keys and runs them, Config.Concurrency
// at a time. It takes them in chunks, each while the keys taken before it run, so
// that the workers start after the first chunk's takeover rather than the whole
// batch's: first Concurrency keys (one for each worker), then chunkGrowth times as
// many as the chunk before, until BatchSize are taken, a chunk comes back short
// (nothing more is due), stop (nil: never) is closed or ctx ended. A key a worker
// gets to after stop or ctx ended, or with less than half its lease left, is given
// back unrun. The error joins the failures: taking keys (the keys taken before are
// run), and recording a key's fate; a key's failed attempt is not one.
func (s *Takeover) RunOnce(ctx context.Context, stop <-chan struct{}) (TakeoverStats, error) {
	var st TakeoverStats
	if Stopped(ctx, stop) {
		return st, nil
	}
	limit := cmp.Or(s.Config.BatchSize, BatchSizeDefault)
	workers := min(cmp.Or(s.Config.Concurrency, ConcurrencyDefault), limit)
	first, err := s.TakeDue(ctx, workers, s.Config.Grace)
	if err != nil {
		return st, fmt.Errorf("take due keys: %w", err)
	}
	if len(first) == 0 {
		return st, nil
	}
	queue := make(chan *Taken, limit)
	for _, t := range first {
		queue <- t
	}
	taken, more := len(first), len(first) == workers
	var terr error
	var taker sync.WaitGroup
	taker.Go(func() {
		defer close(queue)
		for want := workers; more && taken < limit && !Stopped(ctx, stop); {
			want = min(want*chunkGrowth, limit-taken)
			keys, err := s.TakeDue(ctx, want, s.Config.Grace)
			if err != nil {
				terr = fmt.Errorf("take due keys: %w", err)
				return
			}
			for _, t := range keys {
				queue <- t
			}
			taken, more = taken+len(keys), len(keys) == want
		}
	})
	errs := s.runTaken(ctx, stop, queue, min(workers, len(first)), &st)
	taker.Wait()
	st.Taken = taken
	return st, errors.Join(append([]error{terr}, errs...)...)
}

// chunkGrowth is how many times the keys of the chunk before a chunk of RunOnce takes
// over: few statements for a batch, each taken while the keys before it still run.
const chunkGrowth = 4

// TakeDue takes over, in one short statement (keytable.Store.TakeDue), up to limit keys that are in progress
// with an expired or released lease, due (their backoff has passed), claimed more than
// grace ago (0: GraceDefault; -1: no grace), and of a flow Flows names, in due order
// from a random point (keytable.TakeDue.From, a new one for each statement), wrapping
// around to the oldest: sweepers taking at once, in one process or many, read and lock
// different keys rather than all reach for the oldest, and a lone sweeper still reaches
// every due key. Keys of other flows, and keys a newer build wrote, are left alone. Rows
// locked by anyone else are skipped rather than waited for, so any number of sweepers
// take disjoint sets. Each key taken is told to Event (EventSwept).
//
// It returns an empty slice when nothing is due, and the Store's error when the
// database fails (nothing was taken).
func (s *Takeover) TakeDue(ctx context.Context, limit int, grace time.Duration) ([]*Taken, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("workflow: take due keys: limit %d is not positive", limit)
	}
	flows, points := s.Flows()
	sent := time.Now()
	ctx, cancel := s.Env.bounded(ctx)
	defer cancel()
	rows, err := s.Env.Store.TakeDue(ctx, s.Env.Pool, keytable.TakeDue{
		Limit: limit, Grace: max(cmp.Or(grace, GraceDefault), 0), Lease: s.Config.Lease, Flows: flows,
		Points: points, History: s.Config.History, From: rand.Float64(),
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Taken, len(rows))
	for i, r := range rows {
		out[i] = &Taken{
			Scope: r.Scope, Key: r.Key, ID: r.ID, Flow: r.Flow, RecoveryPoint: r.RecoveryPoint,
			LockVersion: r.LockVersion, Attempts: r.Attempts, Row: r, At: sent,
		}
		s.event(ctx, EventSwept, out[i])
	}
	return out, nil
}

// runTaken runs the keys of queue until it is closed, in workers goroutines, counting
// their fates in st.
func (s *Takeover) runTaken(ctx context.Context, stop <-chan struct{}, queue <-chan *Taken, workers int, st *TakeoverStats) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for t := range queue {
				if Stopped(ctx, stop) || t.LeaseLeft() < s.Config.Lease/2 {
					err := s.GiveBack(ctx, t)
					mu.Lock()
					st.GivenBack++
					if err != nil {
						errs = append(errs, fmt.Errorf("give back key %q: %w", t.Key, err))
					}
					mu.Unlock()
					continue
				}
				ran, err := s.Run(ctx, t, s.Config.Run)
				s.logFate(ctx, t, ran)
				mu.Lock()
				st.count(ran.Fate)
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

// count adds a run key's fate to st.
func (st *TakeoverStats) count(f Fate) {
	switch f {
	case FateFinished:
		st.Finished++
	case FateReleased:
		st.Released++
	case FateDeadLettered:
		st.DeadLettered++
	case FateLeaseLost:
		st.LeaseLost++
	case FateParked:
		st.Parked++
	}
}

// logFate logs a key the sweeper finished, parked or dead-lettered: its id, scope,
// client key, flow and the recovery point it was resumed from, never its body or
// response. A dead-lettered key is a warning with its last error.
func (s *Takeover) logFate(ctx context.Context, t *Taken, ran Ran) {
	level, msg := slog.LevelInfo, ""
	switch ran.Fate {
	case FateFinished:
		msg = "sweeper: key finished"
	case FateParked:
		msg = "sweeper: key parked"
	case FateDeadLettered:
		level, msg = slog.LevelWarn, "sweeper: key dead-lettered"
	default:
		return
	}
	attrs := []slog.Attr{
		slog.Group("key", slog.String("id", t.ID), slog.String("scope", t.Scope), slog.String("key", t.Key)),
		slog.String("flow", t.Flow), slog.String("recovery_point", t.RecoveryPoint), slog.Int("attempts", t.Attempts),
	}
	if ran.Fate == FateDeadLettered {
		attrs = append(attrs, slog.Any("err", ran.Err))
	}
	s.Env.Logger.LogAttrs(ctx, level, msg, attrs...)
}

// SettleTimeout bounds the statements that record a taken key's fate; they run even
// when the caller's context has ended, so that the key is not left leased.
const SettleTimeout = 10 * time.Second

// GiveBack returns a taken key without running it, as a sweeper does when it stops or
// when too little of the lease is left: the lease is cleared, the attempt the takeover
// counted is uncounted, and the key stays due for any sweeper. It runs even if ctx has
// ended (bounded by SettleTimeout). It returns nil if the key was taken over by someone
// else meanwhile, and the Store's error when the database fails.
func (s *Takeover) GiveBack(ctx context.Context, t *Taken) error {
	if t == nil || t.Row == nil {
		return errors.New("workflow: give back taken key: not a key from TakeDue")
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SettleTimeout)
	defer cancel()
	err := s.Env.Store.GiveBack(rctx, s.Env.Pool, t.Fence())
	if errors.Is(err, keytable.ErrLeaseLost) {
		return nil
	}
	if err != nil {
		return err
	}
	s.event(ctx, EventGivenBack, t)
	return nil
}

func (s *Takeover) event(ctx context.Context, ev Event, t *Taken) {
	if s.Event != nil {
		s.Event(ctx, ev, t)
	}
}
