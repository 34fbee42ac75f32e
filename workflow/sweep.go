package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/internal/attempt"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/maintenance"
	"github.com/idemflow/idemflow/phases"
)

// The engine's side of the takeover service (internal/maintenance): the flows it may
// take, the events it reports, and the one call into the executor, runSwept, that
// runs a taken key through the same phase code a retry runs.

// takeoverService is the takeover service of a sweeper with settings c.
func (e *Engine) takeoverService(env *maintenance.Env, c *SweeperConfig) *maintenance.Takeover {
	tk := &maintenance.Takeover{
		Env: env,
		Config: maintenance.TakeoverConfig{BatchSize: c.BatchSize, Concurrency: c.Concurrency, Grace: c.Grace,
			Run: maintenance.RunOpts{MaxAttempts: c.MaxAttempts, ParkFor: c.Retention}, Lease: e.cfg.Lease,
			History: e.cfg.historyKeep()},
		Flows: e.knownPoints,
		Event: func(ctx context.Context, ev maintenance.Event, t *maintenance.Taken) {
			kind := OutcomeSwept
			if ev == maintenance.EventGivenBack {
				kind = OutcomeGivenBack
			}
			e.acted(ctx, KeyEvent{Kind: kind, Flow: t.Flow, Scope: t.Scope, Key: t.Key, RecoveryPoint: t.RecoveryPoint})
		},
	}
	tk.Run = func(ctx context.Context, t *maintenance.Taken, opts maintenance.RunOpts) (maintenance.Ran, error) {
		res, err := e.runSwept(ctx, tk, t, opts)
		return maintenance.Ran{Fate: fateOf(res.Outcome), Err: res.Err}, err
	}
	return tk
}

// fateOf is a swept key's outcome as the takeover counts it.
func fateOf(o Outcome) maintenance.Fate {
	switch o {
	case OutcomeFinished:
		return maintenance.FateFinished
	case OutcomeReleased:
		return maintenance.FateReleased
	case OutcomeParked:
		return maintenance.FateParked
	case OutcomeDeadLettered:
		return maintenance.FateDeadLettered
	case OutcomeLeaseLost:
		return maintenance.FateLeaseLost
	}
	return maintenance.FateOther
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

// clientOnlyFlows are the names of the registered client-only flows: only their keys
// are parked, and expire as parked.
func (e *Engine) clientOnlyFlows() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var flows []string
	for name, f := range e.flows {
		if f.ClientOnly {
			flows = append(flows, name)
		}
	}
	return flows
}

// runSwept runs a key taken by the takeover service tk from its recovery point, with
// the request stored on the key, through the same phase code a client's retry runs:
// the takeover's one call into the executor (its RunFunc).
//
// A key of a client-only flow (phases.Flow.ClientOnly, such as idemhttp's middlewares')
// is not run: its phases come with its client's attempts. It is parked (OutcomeParked): released so that the
// client's next retry takes it over and runs it afresh, with ErrNeedsClient as its last error, the
// sweeper's attempt uncounted, and not due for sweeps again for opts.ParkFor. Such a
// key is never dead-lettered by a sweep: only its client can finish it, and a retry
// that finds it dead-lettered could not.
//
// TakeDue does not take a key a newer build wrote (ErrNewerFormat: its recovery point
// names a phase the flow does not have, or a format is newer). Should one be taken all
// the same, it is given back unrun (tk.GiveBack), neither released as a failed
// attempt nor dead-lettered, and runSwept reports it released with that cause. A key whose phase
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
// sweep takes it again.
func (e *Engine) runSwept(ctx context.Context, tk *maintenance.Takeover, t *maintenance.Taken, opts maintenance.RunOpts) (Result, error) {
	if t == nil || t.Row == nil {
		return Result{}, errors.New("workflow: run taken key: not a key from TakeDue")
	}
	ev := AttemptEvent{Executor: ExecutorSweeper, Flow: t.Flow, Scope: t.Scope, Key: t.Key, ID: t.ID,
		Attempt: t.Attempts, RecoveryPoint: t.RecoveryPoint, Origin: t.Row.Origin}
	return e.runAttempt(ctx, ev, func(ctx context.Context) (Result, error) {
		out, err := e.runTaken(ctx, tk, t, opts)
		return withKey(out, t.ID, t.Flow, t.Row.Origin, t.RecoveryPoint, t.Attempts), err
	})
}

// runTaken is runSwept without its hooks.
func (e *Engine) runTaken(ctx context.Context, tk *maintenance.Takeover, t *maintenance.Taken, opts maintenance.RunOpts) (Result, error) {
	f, ok := e.flow(t.Flow)
	if ok && f.ClientOnly {
		return e.park(ctx, t, opts.ParkFor)
	}
	if !ok { // TakeDue takes only registered flows, and flows are never unregistered
		return e.settleUnrun(ctx, t, fmt.Errorf("%w: %q", ErrUnknownFlow, t.Flow), opts.Attempts())
	}
	if err := e.checkRow(t.Row); err != nil { // a newer build's key: give it back unrun, for a build that reads it
		return Result{Outcome: OutcomeReleased, Err: err}, tk.GiveBack(ctx, t)
	}
	next, _ := f.Index(t.RecoveryPoint) // checkRow has found it
	row, err := e.openedRow(ctx, t.Row)
	if err != nil {
		return e.settleUnrun(ctx, t, err, opts.Attempts())
	}
	x, err := attempt.Take(&e.env, f, row, t.At, attempt.Taken{By: ExecutorSweeper, MaxAttempts: opts.Attempts()})
	if err != nil {
		return e.settleUnrun(ctx, t, err, opts.Attempts())
	}
	out := x.Drive(ctx, next+1).Out
	if out.Outcome == OutcomeFailed || out.Outcome == OutcomeShed {
		// Should drive ever return a failure without releasing the key, it is a failed
		// attempt all the same: release it rather than leave it leased.
		out = x.Release(ctx, out.Err)
	}
	return withKey(out, t.ID, t.Flow, t.Row.Origin, x.RecoveryPoint(), t.Attempts), nil
}

// settleUnrun releases or dead-letters a taken key that was not run, recording cause.
func (e *Engine) settleUnrun(ctx context.Context, t *maintenance.Taken, cause error, maxAttempts int) (Result, error) {
	if maxAttempts > 0 && t.Attempts >= maxAttempts {
		return e.deadLetter(ctx, t, cause)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maintenance.SettleTimeout)
	defer cancel()
	err := e.store.Release(rctx, e.pool, t.Fence(), keytable.Release{RecoveryPoint: t.RecoveryPoint, Stored: t.RecoveryPoint, Data: t.Row.PhaseData, LastError: cause.Error(), RetryIn: e.cfg.backoff(t.Attempts),
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
func (e *Engine) park(ctx context.Context, t *maintenance.Taken, d time.Duration) (Result, error) {
	if d <= 0 {
		d = e.cfg.BackoffMax
	}
	cause := fmt.Errorf("%w: flow %q is client-only", ErrNeedsClient, t.Flow)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maintenance.SettleTimeout)
	defer cancel()
	err := e.store.Park(rctx, e.pool, t.Fence(), keytable.Park{LastError: cause.Error(), RetryIn: d, History: e.sweepEntry(t, OutcomeParked, cause)})
	return settled(OutcomeParked, cause, err)
}

// deadLetter marks a taken key that was not run dead with cause, under its fence. If
// the fence no longer matches, the key was released and taken by someone else in
// between: that executor decides its fate.
func (e *Engine) deadLetter(ctx context.Context, t *maintenance.Taken, cause error) (Result, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maintenance.SettleTimeout)
	defer cancel()
	err := e.store.DeadLetter(rctx, e.pool, t.Fence(), keytable.DeadLetter{RecoveryPoint: t.RecoveryPoint, Stored: t.RecoveryPoint, Data: t.Row.PhaseData, LastError: cause.Error(),
		History: e.sweepEntry(t, OutcomeDeadLettered, cause)})
	out, uerr := settled(OutcomeDeadLettered, cause, err)
	if uerr != nil {
		out.Outcome = OutcomeReleased // unrecorded: the key stays as it was, in progress
	}
	return out, uerr
}

// sweepEntry is the history entry of a sweep that did not run taken key t.
func (e *Engine) sweepEntry(t *maintenance.Taken, outcome Outcome, cause error) keytable.History {
	return e.entry(Attempt{Attempt: t.Attempts, By: ExecutorSweeper, From: t.RecoveryPoint, Outcome: outcome,
		Error: cause.Error()})
}

// backoff is how long a key released after its attempts-th attempt waits before it is
// due again: BackoffBase doubled per attempt after the first, capped at BackoffMax.
func (c *Config) backoff(attempts int) time.Duration {
	return attempt.Backoff(c.BackoffBase, c.BackoffMax, attempts)
}
