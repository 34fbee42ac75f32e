package vocab

import "github.com/idemflow/idemflow/phases"

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
