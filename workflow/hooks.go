package workflow

import (
	"context"
	"strings"
	"unicode/utf8"

	"github.com/idemflow/idemflow/internal/vocab"
)

// Executor says who runs an attempt on a key.
type Executor = vocab.Executor

// Executors.
const (
	// ExecutorClient is an attempt of Do or Resume: a client's request or its retry.
	ExecutorClient = vocab.ExecutorClient
	// ExecutorSweeper is a sweeper's attempt on a key it took over.
	ExecutorSweeper = vocab.ExecutorSweeper
	// ExecutorOperator is an operator's action through the admin API (ReleaseKey,
	// Redrive); it runs no phase.
	ExecutorOperator = vocab.ExecutorOperator
)

// AttemptEvent describes one attempt on a key: a call of Do or Resume, or a sweeper's
// run of a key it took over. AttemptStart sees what is known before the key is read
// (for Do and Resume: the executor, scope, key and, for Do, flow); AttemptEnd sees it
// all: the key row's identity (ID), the key's attempt number (Attempt: its claim is
// 1, each takeover adds one; 0 for an attempt that ran nothing), where the key
// resumes or stands (RecoveryPoint), what Hooks.Origin returned for the attempt that
// claimed it (Origin), and how the attempt ended (Outcome, Phase, Err).
type AttemptEvent = vocab.AttemptEvent

// PhaseEvent describes a phase being run. Its DerivedKey is the phase's derived key,
// as phases.Run.DerivedKey gives it to the phase's function.
type PhaseEvent = vocab.PhaseEvent

// KeyEvent describes something that happened to a key: Kind is what happened, an
// Outcome (the one vocabulary of results, events, history and metrics);
// RecoveryPoint the key's recovery point after the event, where known; Err the
// failure behind OutcomeReleased, OutcomeDeadLettered, OutcomeLeaseLost and
// OutcomeParked.
type KeyEvent = vocab.KeyEvent

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

// maxOriginBytes is the longest origin stored with a key (see Hooks.Origin).
const maxOriginBytes = 512

// JoinHooks returns hooks that run each of hs's, in order: start hooks pass the
// context each returns to the next, and Origin is the first non-empty one's. A field
// none of hs sets stays nil, so joining costs nothing where nothing observes.
func JoinHooks(hs ...Hooks) Hooks {
	return Hooks{
		AttemptStart: joinStart(hs, func(h *Hooks) func(context.Context, AttemptEvent) context.Context { return h.AttemptStart }),
		AttemptEnd:   joinEvent(hs, func(h *Hooks) func(context.Context, AttemptEvent) { return h.AttemptEnd }),
		PhaseStart:   joinStart(hs, func(h *Hooks) func(context.Context, PhaseEvent) context.Context { return h.PhaseStart }),
		ClaimHeld:    joinEvent(hs, func(h *Hooks) func(context.Context, PhaseEvent) { return h.ClaimHeld }),
		BeforeCommit: joinEvent(hs, func(h *Hooks) func(context.Context, PhaseEvent) { return h.BeforeCommit }),
		PhaseEnd:     joinEnd(hs, func(h *Hooks) func(context.Context, PhaseEvent, error) { return h.PhaseEnd }),
		Key:          joinEvent(hs, func(h *Hooks) func(context.Context, KeyEvent) { return h.Key }),
		Origin:       joinOrigin(hs),
	}
}

// collect returns the hooks get finds set (isSet) in hs.
func collect[F any](hs []Hooks, get func(*Hooks) F, isSet func(F) bool) []F {
	var out []F
	for i := range hs {
		if f := get(&hs[i]); isSet(f) {
			out = append(out, f)
		}
	}
	return out
}

// pick is the joined hook of fs: none (the zero F, a nil func) when fs is empty, the
// one when there is one, else all, which runs them all.
func pick[F any](fs []F, all F) F {
	switch len(fs) {
	case 0:
		var none F
		return none
	case 1:
		return fs[0]
	}
	return all
}

func joinEvent[E any](hs []Hooks, get func(*Hooks) func(context.Context, E)) func(context.Context, E) {
	fs := collect(hs, get, func(f func(context.Context, E)) bool { return f != nil })
	return pick(fs, func(ctx context.Context, ev E) {
		for _, f := range fs {
			f(ctx, ev)
		}
	})
}

func joinEnd[E any](hs []Hooks, get func(*Hooks) func(context.Context, E, error)) func(context.Context, E, error) {
	fs := collect(hs, get, func(f func(context.Context, E, error)) bool { return f != nil })
	return pick(fs, func(ctx context.Context, ev E, err error) {
		for _, f := range fs {
			f(ctx, ev, err)
		}
	})
}

func joinStart[E any](hs []Hooks, get func(*Hooks) func(context.Context, E) context.Context) func(context.Context, E) context.Context {
	fs := collect(hs, get, func(f func(context.Context, E) context.Context) bool { return f != nil })
	return pick(fs, func(ctx context.Context, ev E) context.Context {
		for _, f := range fs {
			if c := f(ctx, ev); c != nil {
				ctx = c
			}
		}
		return ctx
	})
}

func joinOrigin(hs []Hooks) func(context.Context) string {
	fs := collect(hs, func(h *Hooks) func(context.Context) string { return h.Origin },
		func(f func(context.Context) string) bool { return f != nil })
	return pick(fs, func(ctx context.Context) string {
		for _, f := range fs {
			if s := f(ctx); s != "" {
				return s
			}
		}
		return ""
	})
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

// origin is the origin to store with a new key: Origin's, if it can be stored.
func (h *Hooks) origin(ctx context.Context) string {
	if h.Origin == nil {
		return ""
	}
	s := h.Origin(ctx)
	if len(s) > maxOriginBytes || !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return ""
	}
	return s
}
