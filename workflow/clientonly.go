package workflow

import (
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/phases"
)

// Client-only flows (phases.Flow.ClientOnly) are registered by the names and kinds of
// their phases; every attempt brings the functions (Request.ClientPhases), closing over
// what only that attempt has, such as package idemhttp's live request. There is no
// other way for a phase to reach its client: nothing rides in the context, and the
// engine keeps no per-attempt state of its own.

var (
	// ErrNeedsClient: a key of a client-only flow (phases.Flow.ClientOnly) was to be run
	// without its client: by Do without Request.ClientPhases, by Resume, or by a sweeper,
	// which parks such keys and records this as their last error. Only the client's
	// retry can finish the key. Nothing was run.
	ErrNeedsClient = errors.New("only the client's retry can finish this key")
	// ErrUnstorable is for phase functions to wrap: the phase ran, so its effect may
	// have happened, but its answer cannot be stored (package idemhttp's middleware
	// returns "the handler ran but " + this for a handler whose response is too large
	// or that panicked after it began writing). Running the phase again would repeat
	// the effect, so the key is dead-lettered at once instead of released, and the
	// attempt fails with ErrDeadLettered, as every later one does until Redrive.
	ErrUnstorable = errors.New("its answer cannot be stored")
)

// attemptFlow returns the flow an attempt runs: f itself, or for a client-only flow,
// f with the attempt's own phases (req nil: an attempt without its client, Resume's).
func attemptFlow(f phases.Flow, req *Request) (phases.Flow, error) {
	if !f.ClientOnly {
		if req != nil && req.ClientPhases != nil {
			return phases.Flow{}, fmt.Errorf("%w: flow %q is not client-only: ClientPhases must be nil", ErrInvalidRequest, f.Name)
		}
		return f, nil
	}
	if req == nil || req.ClientPhases == nil {
		return phases.Flow{}, fmt.Errorf("%w: flow %q is client-only", ErrNeedsClient, f.Name)
	}
	if len(req.ClientPhases) != len(f.Phases) {
		return phases.Flow{}, fmt.Errorf("%w: flow %q has %d phases, the attempt brought %d", ErrInvalidRequest, f.Name, len(f.Phases), len(req.ClientPhases))
	}
	for i, p := range req.ClientPhases {
		if want := f.Phases[i]; p.Name != want.Name || p.Kind != want.Kind {
			return phases.Flow{}, fmt.Errorf("%w: flow %q phase %d is %s %q, the attempt brought %s %q",
				ErrInvalidRequest, f.Name, i, want.Kind, want.Name, p.Kind, p.Name)
		}
	}
	f.Phases = req.ClientPhases
	return f, nil
}
