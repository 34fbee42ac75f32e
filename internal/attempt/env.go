package attempt

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
)

// Env is what the executor reads of the engine that runs it: the key table's driver,
// the pool, the engine's admission, hooks and services, and the settings of
// workflow.Config it obeys, copied when the engine is made. One Env serves every
// attempt of an engine.
type Env struct {
	Store *keytable.Store
	Pool  Pool
	// Hooks are the engine's (workflow.Config.Hooks).
	Hooks     *vocab.Hooks
	Admission Admission
	// Acquire takes a connection before a new key's claim, its wait bounded by
	// Config.AdmitWait.
	Acquire func(ctx context.Context) (*pgxpool.Conn, error)
	// Keeps reports whether a response header of canonical name is stored and replayed.
	Keeps func(canonical string) bool
	// Seal seals a response's body when the engine has a Sealer, marking its headers.
	Seal func(ctx context.Context, scope, key string, r keytable.StoredResponse) (keytable.StoredResponse, error)

	Lease       time.Duration
	TxRetries   int // never negative
	HistoryKeep int // 0: no history
	// HistoryOmitCleanFinish: no entry for a first attempt that finished from the start
	// (Config.HistoryOmitCleanFinish).
	HistoryOmitCleanFinish  bool
	BackoffBase, BackoffMax time.Duration
	MaxResponseBytes        int
	MaxPhaseDataBytes       int
	StandbyWait             time.Duration
	StandbyNames            []string
	ClaimWithFirstStatement bool
	Logger                  *slog.Logger

	standbyWarned atomic.Bool // the standby wait warned that the role cannot read positions
}

// The executor's calls of the engine's hooks (Env.Hooks): each hook is optional.

func (env *Env) claimHeld(ctx context.Context, ev vocab.PhaseEvent) {
	if env.Hooks.ClaimHeld != nil {
		env.Hooks.ClaimHeld(ctx, ev)
	}
}

func (env *Env) phaseStart(ctx context.Context, ev vocab.PhaseEvent) context.Context {
	if env.Hooks.PhaseStart == nil {
		return ctx
	}
	if c := env.Hooks.PhaseStart(ctx, ev); c != nil {
		return c
	}
	return ctx
}

func (env *Env) beforeCommit(ctx context.Context, ev vocab.PhaseEvent) {
	if env.Hooks.BeforeCommit != nil {
		env.Hooks.BeforeCommit(ctx, ev)
	}
}

func (env *Env) phaseEnd(ctx context.Context, ev vocab.PhaseEvent, err error) {
	if env.Hooks.PhaseEnd != nil {
		env.Hooks.PhaseEnd(ctx, ev, err)
	}
}

// keyEvent is the key event of one of the attempt's milestones (OutcomeClaimed), at
// the moment it happens: crash tests stop a process there.
func (env *Env) keyEvent(ctx context.Context, ev vocab.KeyEvent) {
	if env.Hooks.Key != nil {
		env.Hooks.Key(ctx, ev)
	}
}

// Pool is what the executor needs of the engine's pool.
type Pool interface {
	keytable.DBTX
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Admission is the engine's register of running executors, for a drain.
type Admission interface {
	// Enter registers x before its phases run; false when a drain's deadline passed.
	Enter(x *Exec) bool
	// Leave unregisters x once its phases ended.
	Leave(x *Exec)
	// Draining reports whether a drain began: no call phase starts after it.
	Draining() bool
}

// Backoff is how long a key released after its attempts-th attempt waits before the
// sweeper may take it again: base doubled per attempt after the first, at most max.
func Backoff(base, max time.Duration, attempts int) time.Duration {
	d := base
	for i := 1; i < attempts && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}
