package attempt

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/runstate"
	"github.com/idemflow/idemflow/phases"
)

// Compensate runs comp, the compensation of a cancel, on row from its recovery point
// (body is the row's request body, opened), and the cancel c, in one transaction
// fenced as a Go-code tx phase's: the check of the row's fence ahead of the
// compensation's first statement (an in-progress row; a dead-lettered one has no
// holder to fence out), the compensation's Go code on the managed transaction
// (phaseTx: its own Commit is refused, and nothing reaches it once it returned), then
// the cancel's fenced write with COMMIT in one round trip (keytable.KeyWrite.Cancel).
// The transaction is bounded by the lease.
//
// failed is the compensation's own error (its panic as a *phases.PanicError), with
// nothing committed. err is keytable.ErrLeaseLost when the check refused (the row
// moved; nothing committed), the failure of what comes before the compensation runs,
// or the write's failure as the cancel's (a write that missed wraps
// keytable.ErrLeaseLost).
func Compensate(ctx context.Context, env *Env, comp phases.Compensation, row *keytable.Row, body []byte, c keytable.Cancel) (failed, err error) {
	run, err := newRun(runstate.Info{
		Scope: row.Scope, Key: row.Key, ID: row.ID, Flow: row.Flow,
		Method: row.Method, Route: row.Route, Body: body, Attempt: row.Attempts,
	}, row.PhaseData)
	if err != nil {
		return nil, err
	}
	(*runstate.Run)(run).Enter(comp.Name)
	ctx, cancel := context.WithTimeout(ctx, env.Lease)
	defer cancel()
	pc, err := env.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", keytable.Classify(err))
	}
	tx := newPhaseTx(pc, env.Store, pgx.ReadCommitted)
	defer tx.done(ctx)
	if row.Status == keytable.StatusInProgress {
		tx.startWith(keytable.Head{Fence: row.Fence()})
	}
	v := verdict{kind: goOn}
	if err := runCompensation(ctx, comp, tx, run, row.RecoveryPoint); err != nil {
		v = verdict{kind: fail, err: err}
	}
	switch v = tx.end(v); {
	case v.kind == goOn:
	case errors.Is(v.err, keytable.ErrLeaseLost):
		return nil, v.err // the check refused: the row moved
	default:
		return v.err, nil
	}
	p := plan{write: keytable.KeyWrite{Fence: row.Fence(), Cancel: &c}}
	if err := tx.send(ctx, &p); err != nil {
		return nil, fmt.Errorf("workflow: cancel key: %w", err)
	}
	return nil, nil
}

// runCompensation calls a compensation's function, turning a panic into an error.
func runCompensation(ctx context.Context, comp phases.Compensation, tx phases.DBTX, run *phases.Run, reached string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &phases.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return comp.Func(ctx, tx, run, reached)
}
