package vocab

import (
	"context"

	"github.com/idemflow/idemflow/phases"
)

// Executor says who runs an attempt on a key.
type Executor string

// Executors.
const (
	// ExecutorClient is an attempt of Do or Resume: a client's request or its retry.
	ExecutorClient Executor = "client"
	// ExecutorSweeper is a sweeper's attempt on a key it took over.
	ExecutorSweeper Executor = "sweeper"
	// ExecutorOperator is an operator's action through the admin API (ReleaseKey,
	// Redrive); it runs no phase.
	ExecutorOperator Executor = "operator"
)

// AttemptEvent describes one attempt on a key: a call of Do or Resume, or a sweeper's
// run of a key it took over. AttemptStart sees what is known before the key is read
// (for Do and Resume: the executor, scope, key and, for Do, flow); AttemptEnd sees it
// all.
type AttemptEvent struct {
	Executor Executor
	Flow     string
	Scope    string
	Key      string
	// ID is the key row's identity; empty while unknown, and at the end of an attempt
	// that never found or made a row (invalid input stops before the event).
	ID string
	// Attempt is the key's attempt number (its claim is 1, each takeover adds one);
	// 0 for an attempt that ran nothing (a replay, a 409, a mismatch).
	Attempt int
	// RecoveryPoint is where the key resumes (AttemptStart of a sweep) or stands when
	// the attempt ends (AttemptEnd).
	RecoveryPoint string
	// Origin is what Hooks.Origin returned for the attempt that claimed the key, as
	// stored with it: set whenever the key row was read (every attempt but a new key's
	// first).
	Origin string
	// Outcome, Phase and Err are set at the end: how the attempt ended, the phase it
	// failed in (released, dead-lettered, lease lost) and the error returned.
	Outcome Outcome
	Phase   string
	Err     error
}

// PhaseEvent describes a phase being run.
type PhaseEvent struct {
	Flow        string
	Phase       string
	Kind        phases.Kind
	Scope       string
	Key         string
	ID          string // the key row's identity
	LockVersion int64
	Attempt     int
	Executor    Executor
}

// DerivedKey is the phase's derived key, as phases.Run.DerivedKey gives it to the
// phase's function.
func (ev PhaseEvent) DerivedKey() string { return ev.ID + ":" + ev.Phase }

// KeyEvent describes something that happened to a key.
type KeyEvent struct {
	// Kind is what happened: an Outcome, the one vocabulary of results, events,
	// history and metrics.
	Kind  Outcome
	Flow  string
	Scope string
	Key   string
	// RecoveryPoint is the key's recovery point after the event, where known.
	RecoveryPoint string
	// Err is the failure behind OutcomeReleased, OutcomeDeadLettered, OutcomeLeaseLost
	// and OutcomeParked.
	Err error
}

// Hooks observe the engine, for logging, metrics, tracing and tests' fault injection.
// Every field is optional. Hooks run synchronously on the request's goroutine and must
// be safe for concurrent use. Several observers combine with JoinHooks.
//
// The context a start hook returns is the one the engine passes on: AttemptStart's to
// everything in the attempt (its phases, key events and AttemptEnd), PhaseStart's to
// the phase's function and the phase's other hooks.
type Hooks struct {
	// ClaimHeld runs when a new key's claim is held in the transaction of its flow's
	// first tx phase and before that phase's function runs: the claim lock is taken,
	// nothing of the key is committed and nothing of the flow has run. It runs after
	// PhaseStart, once per claim (again if the transaction is re-run after a conflict).
	// It does not run for a key taken over, nor for a flow whose first phase is a call
	// (its claim commits on its own, before PhaseStart of the call). With
	// Config.ClaimWithFirstStatement the claim rides with the phase's first statement:
	// ClaimHeld then runs inside that statement's call, once the claim came back and
	// before the statement's result reaches the phase function (the statement ran,
	// uncommitted), and not at all for a phase that sends no statement (its claim rides
	// with its commit). Crash tests stop a process here (see package idemflowtest).
	ClaimHeld func(ctx context.Context, ev PhaseEvent)
	// AttemptStart runs when an attempt starts: at the start of Do (after its input was
	// validated) and Resume, and of a sweeper's run of a key it took over.
	AttemptStart func(ctx context.Context, ev AttemptEvent) context.Context
	// AttemptEnd runs once when that attempt ends, with its outcome.
	AttemptEnd func(ctx context.Context, ev AttemptEvent)
	// PhaseStart runs before a phase: for a tx phase before its transaction begins, for
	// a call phase before the call. The context it returns is used for the phase.
	PhaseStart func(ctx context.Context, ev PhaseEvent) context.Context
	// BeforeCommit runs after a tx phase's function returned successfully and before
	// its COMMIT is sent.
	BeforeCommit func(ctx context.Context, ev PhaseEvent)
	// PhaseEnd runs after a phase: for a tx phase after its commit (err nil) or
	// rollback, for a call phase after the call returned.
	PhaseEnd func(ctx context.Context, ev PhaseEvent, err error)
	// Key runs after lifecycle events of a key.
	Key func(ctx context.Context, ev KeyEvent)
	// Origin returns a short text that identifies the attempt that claims a new key,
	// such as a W3C traceparent, to be stored with the key (in the write that creates
	// its row) and handed to every later attempt as AttemptEvent.Origin. It runs once
	// per new key, with AttemptStart's context. Texts over 512 bytes, or not UTF-8
	// without NUL, are not stored.
	Origin func(ctx context.Context) string
}
