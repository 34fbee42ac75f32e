package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/sweeper"
)

// The engine's side of its sweeper: taking over due keys in batches, running them
// through the same phase code a retry runs, dead-lettering and retention. The
// sweeper's loop (sweeper.go) schedules these calls; this file decides what they mean.

// Defaults of takeDueOpts and runOpts: those of sweeper.Config, so that zero means the
// same in both.
const (
	sweepGraceDefault  = sweeper.GraceDefault
	maxAttemptsDefault = sweeper.MaxAttemptsDefault
)

// maintenance is the engine's side of its sweeper: taking over keys whose lease ran
// out, running them from their recovery point, giving back the ones not run, and
// expiring old keys. The sweeper's loop (sweeper.go) schedules these calls; the tests
// of package workflow_test reach them through export_test files.
//
// The words, as everywhere in idemflow: a key is "released" by a failed attempt (its
// lease cleared, due again after a backoff), "given back" when a sweeper took it but
// did not run it (the takeover's attempt uncounted, due at once), and "parked" when
// only its client can finish it (released for the client's retry, left alone by sweeps
// for a while).
type maintenance struct{ e *Engine }

// takeDueOpts select the keys maintenance.TakeDue takes.
type takeDueOpts struct {
	// Limit is the most keys taken. Required, positive.
	Limit int
	// Grace leaves keys claimed less than Grace ago (by the database clock) to their
	// client's own retry. Zero means the default, 5s, as sweeper.Config.Grace; -1 means
	// no grace.
	Grace time.Duration
}

// taken is a key taken over by maintenance.TakeDue: its lock version was bumped, so
// nothing that ran it before can commit, and it holds a fresh lease. Pass it to
// maintenance.Run, or to maintenance.GiveBack if it will not be run.
type taken struct {
	Scope         string
	Key           string
	ID            string // the key row's identity
	Flow          string
	RecoveryPoint string
	LockVersion   int64
	// Attempts counts the claim and every takeover, this one included.
	Attempts int

	row *keytable.Row // the key row as the takeover returned it
	at  time.Time     // when the takeover was sent
}

// fence is the fence of the taken key's row.
func (t *taken) fence() keytable.Fence {
	f := keytable.Fence{Scope: t.Scope, Key: t.Key, ID: t.ID, LockVersion: t.LockVersion}
	if t.row != nil {
		f.CreatedAt = t.row.CreatedAt
	}
	return f
}

// LeaseLeft estimates how much of the lease set by the takeover remains, measured from
// when the takeover was sent.
func (t *taken) LeaseLeft() time.Duration { return t.row.LeaseLeft() - time.Since(t.at) }

// runOpts configure maintenance.Run. A nil *runOpts means all defaults.
type runOpts struct {
	// MaxAttempts dead-letters a key whose failed attempt was its MaxAttempts-th or
	// later (taken.Attempts counts the claim and every takeover). Zero means the
	// default, 10, as sweeper.Config.MaxAttempts; -1 means a key is never
	// dead-lettered.
	MaxAttempts int
	// ParkFor is how long a parked key is left alone by sweeps. Defaults to the
	// engine's BackoffMax.
	ParkFor time.Duration
}

// TakeDue takes over, in one short statement, up to opts.Limit keys that are in
// progress with an expired or released lease, due (their backoff has passed), older
// than opts.Grace, and of a flow registered on this engine, oldest due first. Keys of
// flows this engine does not know are left to a process that registered them, and so
// are keys a newer build wrote (ErrNewerFormat): at a recovery point the flow does not
// have, or with phase data in a newer format. Rows
// locked by anyone else are skipped rather than waited for, so any number of sweepers
// take disjoint sets, and a key that finished or was taken over after the statement's
// snapshot is left alone. Each key taken gets a OutcomeSwept event.
//
// It returns an empty slice when nothing is due, and ErrUnavailable or ErrConflict
// when the database fails (nothing was taken).
func (m maintenance) TakeDue(ctx context.Context, opts takeDueOpts) ([]*taken, error) {
	e := m.e
	if opts.Limit <= 0 {
		return nil, fmt.Errorf("workflow: take due keys: limit %d is not positive", opts.Limit)
	}
	flows, points := e.knownPoints()
	sent := time.Now()
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	rows, err := e.store.TakeDue(ctx, e.pool, keytable.TakeDue{
		Limit: opts.Limit, Grace: max(cmp.Or(opts.Grace, sweepGraceDefault), 0), Lease: e.cfg.Lease, Flows: flows,
		Points: points, History: e.cfg.historyKeep(),
	})
	if err != nil {
		return nil, err
	}
	out := make([]*taken, len(rows))
	for i, r := range rows {
		out[i] = &taken{
			Scope: r.Scope, Key: r.Key, ID: r.ID, Flow: r.Flow, RecoveryPoint: r.RecoveryPoint,
			LockVersion: r.LockVersion, Attempts: r.Attempts, row: r, at: sent,
		}
		e.acted(ctx, KeyEvent{Kind: OutcomeSwept, Flow: r.Flow, Scope: r.Scope, Key: r.Key, RecoveryPoint: r.RecoveryPoint})
	}
	return out, nil
}

// knownPoints are the registered flows' names, and for each the recovery points it
// can resume from: "started" and its phases. A sweep takes no key at another point:
// another build of the flow wrote it, and one that knows the point finishes it.
func (e *Engine) knownPoints() ([]string, map[string][]string) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	flows := make([]string, 0, len(e.flows))
	points := make(map[string][]string, len(e.flows))
	for name, f := range e.flows {
		flows = append(flows, name)
		ps := make([]string, 0, len(f.Phases)+1)
		ps = append(ps, phases.Started)
		for _, p := range f.Phases {
			ps = append(ps, p.Name)
		}
		points[name] = ps
	}
	return flows, points
}

// maxAttempts is opts.MaxAttempts as exec.maxAttempts reads it: 0 for never.
func maxAttempts(o *runOpts) int {
	if o.MaxAttempts < 0 {
		return 0
	}
	return cmp.Or(o.MaxAttempts, maxAttemptsDefault)
}

// Run runs a key taken with TakeDue from its recovery point, with the request
// stored on the key, through the same phase code a client's retry runs.
//
// A key of a client-only flow (phases.Flow.ClientOnly, such as idemhttp's middlewares')
// is not run: its phases come with its client's attempts. It is parked (SweptParked): released so that the client's next retry
// takes it over and runs it afresh, with ErrNeedsClient as its last error, the
// sweeper's attempt uncounted, and not due for sweeps again for opts.ParkFor. Such a
// key is never dead-lettered by a sweep: only its client can finish it, and a retry
// that finds it dead-lettered could not.
//
// TakeDue does not take a key a newer build wrote (ErrNewerFormat: its recovery point
// names a phase the flow does not have, or a format is newer). Should one be taken all
// the same, it is given back unrun (GiveBack), neither released as a failed attempt
// nor dead-lettered, and Run reports it released with that cause. A key whose phase
// data does not decode is not run either: it is released with a backoff and its cause
// as last error, like a failed attempt, so that it is dead-lettered after
// opts.MaxAttempts attempts rather than retried forever.
//
// A failed attempt is released with a backoff (Config.BackoffBase, doubling per
// attempt up to Config.BackoffMax, unless the phase asked for a delay) and the key
// keeps its recovery point; if it was attempt opts.MaxAttempts or later, the key is
// then dead-lettered: status dead, its last error kept, never run again until Redrive.
//
// The error is non-nil only when the key's fate could not be recorded (the database
// failed while releasing or dead-lettering it); its lease then runs out and a later
// sweep takes it again. opts may be nil.
func (m maintenance) Run(ctx context.Context, t *taken, opts *runOpts) (Result, error) {
	e := m.e
	if t == nil || t.row == nil {
		return Result{}, errors.New("workflow: run taken key: not a key from TakeDue")
	}
	ev := AttemptEvent{Executor: ExecutorSweeper, Flow: t.Flow, Scope: t.Scope, Key: t.Key, ID: t.ID,
		Attempt: t.Attempts, RecoveryPoint: t.RecoveryPoint, Origin: t.row.Origin}
	return e.runAttempt(ctx, ev, func(ctx context.Context) (Result, error) {
		if opts == nil {
			opts = &runOpts{}
		}
		out, err := e.runTaken(ctx, t, opts)
		return withKey(out, t.ID, t.Flow, t.row.Origin, t.RecoveryPoint, t.Attempts), err
	})
}

// runTaken is Run without its hooks.
func (e *Engine) runTaken(ctx context.Context, t *taken, opts *runOpts) (Result, error) {
	f, ok := e.flow(t.Flow)
	if ok && f.ClientOnly {
		return e.park(ctx, t, opts.ParkFor)
	}
	if !ok { // TakeDue takes only registered flows, and flows are never unregistered
		return e.settleUnrun(ctx, t, fmt.Errorf("%w: %q", ErrUnknownFlow, t.Flow), maxAttempts(opts))
	}
	if err := e.checkRow(t.row); err != nil { // a newer build's key: give it back unrun, for a build that reads it
		return Result{Outcome: OutcomeReleased, Err: err}, (maintenance{e}).GiveBack(ctx, t)
	}
	next, _ := f.Index(t.RecoveryPoint) // checkRow has found it
	row, err := e.openedRow(ctx, t.row)
	if err != nil {
		return e.settleUnrun(ctx, t, err, maxAttempts(opts))
	}
	x, err := e.newExec(f, row, t.at)
	if err != nil {
		return e.settleUnrun(ctx, t, err, maxAttempts(opts))
	}
	x.maxAttempts = maxAttempts(opts)
	x.by = ExecutorSweeper

	out := x.drive(ctx, next+1).out
	if out.Outcome == OutcomeFailed || out.Outcome == OutcomeShed {
		// Should drive ever return a failure without releasing the key, it is a failed
		// attempt all the same: release it rather than leave it leased.
		out = x.transient(ctx, x.rp, out.Err, nil)
	}
	return withKey(out, t.ID, t.Flow, t.row.Origin, x.rp, t.Attempts), nil
}

// settleUnrun releases or dead-letters a taken key that was not run, recording cause.
func (e *Engine) settleUnrun(ctx context.Context, t *taken, cause error, maxAttempts int) (Result, error) {
	if maxAttempts > 0 && t.Attempts >= maxAttempts {
		return e.deadLetter(ctx, t, cause)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	err := e.store.Release(rctx, e.pool, t.fence(), keytable.Release{RecoveryPoint: t.RecoveryPoint, Stored: t.RecoveryPoint, Data: t.row.PhaseData, LastError: cause.Error(), RetryIn: e.cfg.backoff(t.Attempts),
		History: e.sweepEntry(t, OutcomeReleased, cause)})
	return settled(OutcomeReleased, cause, err)
}

// settled is the result of a sweep that recorded outcome for a taken key it did not
// run, with cause, by a statement that returned err: recorded if err is nil, lease
// lost if the key was taken over meanwhile, else unrecorded (err is returned: the
// lease runs out and a later sweep takes the key again).
func settled(outcome Outcome, cause, err error) (Result, error) {
	switch {
	case errors.Is(err, keytable.ErrLeaseLost):
		return Result{Outcome: OutcomeLeaseLost, Err: err}, nil
	case err != nil:
		return Result{Outcome: outcome, Err: cause}, err
	}
	return noted(Result{Outcome: outcome, Err: cause}, cause, true), nil
}

// park releases a taken key of a client-only flow for its client.
func (e *Engine) park(ctx context.Context, t *taken, d time.Duration) (Result, error) {
	if d <= 0 {
		d = e.cfg.BackoffMax
	}
	cause := fmt.Errorf("%w: flow %q is client-only", ErrNeedsClient, t.Flow)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	err := e.store.Park(rctx, e.pool, t.fence(), keytable.Park{LastError: cause.Error(), RetryIn: d, History: e.sweepEntry(t, OutcomeParked, cause)})
	return settled(OutcomeParked, cause, err)
}

// deadLetter marks a taken key that was not run dead with cause, under its fence. If
// the fence no longer matches, the key was released and taken by someone else in
// between: that executor decides its fate.
func (e *Engine) deadLetter(ctx context.Context, t *taken, cause error) (Result, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	err := e.store.DeadLetter(rctx, e.pool, t.fence(), keytable.DeadLetter{RecoveryPoint: t.RecoveryPoint, Stored: t.RecoveryPoint, Data: t.row.PhaseData, LastError: cause.Error(),
		History: e.sweepEntry(t, OutcomeDeadLettered, cause)})
	out, uerr := settled(OutcomeDeadLettered, cause, err)
	if uerr != nil {
		out.Outcome = OutcomeReleased // unrecorded: the key stays as it was, in progress
	}
	return out, uerr
}

// sweepEntry is the history entry of a sweep that did not run taken key t.
func (e *Engine) sweepEntry(t *taken, outcome Outcome, cause error) keytable.History {
	return e.entry(Attempt{Attempt: t.Attempts, By: ExecutorSweeper, From: t.RecoveryPoint, Outcome: outcome,
		Error: cut(cause.Error(), maxHistoryError)})
}

// settleTimeout bounds the statements that record a taken key's fate; they run even
// when the caller's context has ended, so that the key is not left leased.
const settleTimeout = 10 * time.Second

// GiveBack returns a key taken with TakeDue without running it, as a sweeper does
// when it stops or when too little of the lease is left: the lease is cleared, the
// attempt the takeover counted is uncounted, and the key stays due for any sweeper.
// It runs even if ctx has ended (bounded by a few seconds). It returns nil if the key
// was taken over by someone else meanwhile, and ErrUnavailable when the database fails.
func (m maintenance) GiveBack(ctx context.Context, t *taken) error {
	e := m.e
	if t == nil || t.row == nil {
		return errors.New("workflow: give back taken key: not a key from TakeDue")
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	err := e.store.GiveBack(rctx, e.pool, t.fence())
	if errors.Is(err, keytable.ErrLeaseLost) {
		return nil
	}
	if err != nil {
		return err
	}
	e.acted(ctx, KeyEvent{Kind: OutcomeGivenBack, Flow: t.Flow, Scope: t.Scope, Key: t.Key, RecoveryPoint: t.RecoveryPoint})
	return nil
}

// ExpireFinished deletes, in one short statement, up to limit finished keys that
// finished more than retention ago by the database clock, oldest first, skipping rows
// locked by anyone else, and returns how many it deleted: fewer than limit means
// nothing more is expired for now. Keys in progress and dead-lettered keys are never
// deleted. A finished key is replayed until it is deleted, so a client can rely on
// replays for at least retention; a retry after the deletion is a new request.
func (m maintenance) ExpireFinished(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	return m.expire(ctx, "finished", retention, func(ctx context.Context) (int64, error) {
		return m.e.store.ExpireFinished(ctx, m.e.pool, retention, limit)
	})
}

// expire runs one expiry statement of what's keys, bounded like the engine's own
// statements, after checking its retention.
func (m maintenance) expire(ctx context.Context, what string, retention time.Duration, run func(context.Context) (int64, error)) (int64, error) {
	if retention <= 0 {
		return 0, fmt.Errorf("workflow: expire %s keys: retention %s is not positive", what, retention)
	}
	ctx, cancel := m.e.bounded(ctx)
	defer cancel()
	return run(ctx)
}

// ExpireDead deletes, in one short statement, up to limit dead-lettered keys that were
// dead-lettered more than retention ago by the database clock, and returns how many.
// A dead-lettered key is listed and can be re-driven until then.
func (m maintenance) ExpireDead(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	return m.expire(ctx, "dead", retention, func(ctx context.Context) (int64, error) {
		return m.e.store.ExpireDead(ctx, m.e.pool, retention, limit)
	})
}

// ExpireParked deletes, in one short statement, up to limit keys of this engine's
// client-only flows that are in progress without a live lease (parked for their
// client) and were claimed more than retention ago, and returns how many. Keys of
// other flows are never deleted by it: a sweeper finishes them or dead-letters them.
func (m maintenance) ExpireParked(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	e := m.e
	e.mu.RLock()
	var flows []string
	for name, f := range e.flows {
		if f.ClientOnly {
			flows = append(flows, name)
		}
	}
	e.mu.RUnlock()
	return m.expire(ctx, "parked", retention, func(ctx context.Context) (int64, error) {
		return e.store.ExpireParked(ctx, e.pool, flows, retention, limit)
	})
}

// backoff is how long a key released after its attempts-th attempt waits before it is
// due again: BackoffBase doubled per attempt after the first, capped at BackoffMax.
func (c *Config) backoff(attempts int) time.Duration {
	d := c.BackoffBase
	for i := 1; i < attempts && d < c.BackoffMax; i++ {
		d *= 2
	}
	return min(d, c.BackoffMax)
}
