package workflow

import (
	"context"

	"github.com/idemflow/idemflow/phases"
)

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
}

// KeyEventKind names what happened to a key.
type KeyEventKind string

// Key events.
const (
	KeyClaimed    KeyEventKind = "claimed"     // a new key row was created
	KeyReplayed   KeyEventKind = "replayed"    // a stored response was returned
	KeyInProgress KeyEventKind = "in_progress" // an attempt was turned away by a live lease
	KeyMismatch   KeyEventKind = "mismatch"    // the key was reused for another request
	KeyTakenOver  KeyEventKind = "taken_over"  // an expired or released lease was taken
	KeyFinished   KeyEventKind = "finished"    // a response was stored
	KeyReleased   KeyEventKind = "released"    // a transient failure released the lease
	KeyLeaseLost  KeyEventKind = "lease_lost"  // a fenced commit found the lease gone
)

// KeyEvent describes something that happened to a key.
type KeyEvent struct {
	Kind  KeyEventKind
	Flow  string
	Scope string
	Key   string
	// RecoveryPoint is the key's recovery point after the event, where known.
	RecoveryPoint string
	// Err is the failure behind KeyReleased and KeyLeaseLost.
	Err error
}

// Hooks observe the engine, for logging, metrics, tracing and tests' fault injection.
// Every field is optional. Hooks run synchronously on the request's goroutine and must
// be safe for concurrent use.
type Hooks struct {
	// ClaimHeld runs when a new key's claim is held in the transaction of its flow's
	// first tx phase and before that phase's function runs: the claim lock is taken,
	// nothing of the key is committed and nothing of the flow has run. It runs after
	// PhaseStart, once per claim (again if the transaction is re-run after a conflict).
	// It does not run for a key taken over, nor for a flow whose first phase is a call
	// (its claim commits on its own, before PhaseStart of the call). Crash tests stop a
	// process here (see package idemflowtest).
	ClaimHeld func(ctx context.Context, ev PhaseEvent)
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
}

func (h *Hooks) claimHeld(ctx context.Context, ev PhaseEvent) {
	if h.ClaimHeld != nil {
		h.ClaimHeld(ctx, ev)
	}
}

func (h *Hooks) phaseStart(ctx context.Context, ev PhaseEvent) context.Context {
	if h.PhaseStart == nil {
		return ctx
	}
	if c := h.PhaseStart(ctx, ev); c != nil {
		return c
	}
	return ctx
}

func (h *Hooks) beforeCommit(ctx context.Context, ev PhaseEvent) {
	if h.BeforeCommit != nil {
		h.BeforeCommit(ctx, ev)
	}
}

func (h *Hooks) phaseEnd(ctx context.Context, ev PhaseEvent, err error) {
	if h.PhaseEnd != nil {
		h.PhaseEnd(ctx, ev, err)
	}
}

func (h *Hooks) key(ctx context.Context, ev KeyEvent) {
	if h.Key != nil {
		h.Key(ctx, ev)
	}
}
