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
type Hooks = vocab.Hooks

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

// storedOrigin is the origin to store with a new key: Origin's, if it can be stored.
func storedOrigin(ctx context.Context, h *Hooks) string {
	if h.Origin == nil {
		return ""
	}
	s := h.Origin(ctx)
	if len(s) > maxOriginBytes || !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return ""
	}
	return s
}
