package workflow

import "github.com/idemflow/idemflow/internal/vocab"

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
	ErrNeedsClient = vocab.ErrNeedsClient
	// ErrUnstorable is for phase functions to wrap: the phase ran, so its effect may
	// have happened, but its answer cannot be stored (package idemhttp's middleware
	// returns "the handler ran but " + this for a handler whose response is too large
	// or that panicked after it began writing). Running the phase again would repeat
	// the effect, so the key is dead-lettered at once instead of released, and the
	// attempt fails with ErrDeadLettered, as every later one does until Redrive.
	ErrUnstorable = vocab.ErrUnstorable
)
