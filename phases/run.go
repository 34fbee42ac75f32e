package phases

import (
	"encoding/json"
	"fmt"

	"github.com/idemflow/idemflow/internal/runstate"
)

// Run is what a phase function gets besides its context: the request it serves, the
// key's identity and the phase data carried between phases. A Run is used by one
// goroutine at a time. The engine makes runs; its side of them (entering a phase,
// undoing a failed phase's data changes) is not on Run's API.
type Run runstate.Run

// state is r as the engine keeps it.
func (r *Run) state() *runstate.Run { return (*runstate.Run)(r) }

// Scope is the key's owner, as resolved by the server.
func (r *Run) Scope() string { return r.state().Info().Scope }

// Key is the client's idempotency key.
func (r *Run) Key() string { return r.state().Info().Key }

// ID is the key row's identity, unique across scopes and never reused.
func (r *Run) ID() string { return r.state().Info().ID }

// Flow is the name of the flow being run.
func (r *Run) Flow() string { return r.state().Info().Flow }

// Method is the request's HTTP method (or the caller's equivalent).
func (r *Run) Method() string { return r.state().Info().Method }

// Route is the request's route pattern.
func (r *Run) Route() string { return r.state().Info().Route }

// Body is the request body as the client sent it. Do not modify it.
func (r *Run) Body() []byte { return r.state().Info().Body }

// Attempt is 1 on the first attempt and grows with each takeover of the key.
func (r *Run) Attempt() int { return r.state().Info().Attempt }

// Phase is the name of the phase being run.
func (r *Run) Phase() string { return r.state().Phase() }

// DerivedKey is the idempotency key to send with the current phase's external call. It
// is built from the key row's identity and the phase name, so it is the same on every
// retry and in the sweeper, differs across scopes, and differs from the derived key of
// any earlier row that used the same client key.
func (r *Run) DerivedKey() string { return r.ID() + ":" + r.Phase() }

// DerivedKeyFor is DerivedKey for a phase that makes several distinct calls: part
// names the call and must be the same on every attempt.
func (r *Run) DerivedKeyFor(part string) string { return r.DerivedKey() + ":" + part }

// Slot is a named, typed value in a run's phase data, set by one phase and read by a
// later one. Values are stored as JSON with the recovery point, so they survive crashes
// and takeovers. Keep them small: the engine refuses phase data over its configured
// limit.
type Slot[T any] struct{ name string }

// NewSlot returns the slot with the given name. Two slots with the same name share
// their value.
func NewSlot[T any](name string) Slot[T] { return Slot[T]{name: name} }

// Name is the slot's key in the phase data.
func (s Slot[T]) Name() string { return s.name }

// Set stores v in the run's phase data.
func (s Slot[T]) Set(r *Run, v T) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode phase data %q: %w", s.name, err)
	}
	r.state().SetValue(s.name, b)
	return nil
}

// Lookup returns the slot's value and whether it was set.
func (s Slot[T]) Lookup(r *Run) (T, bool, error) {
	var v T
	b, ok := r.state().Value(s.name)
	if !ok {
		return v, false, nil
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, true, fmt.Errorf("decode phase data %q: %w", s.name, err)
	}
	return v, true, nil
}

// Get returns the slot's value, or an error wrapping ErrNoValue if it was never set.
func (s Slot[T]) Get(r *Run) (T, error) {
	v, ok, err := s.Lookup(r)
	if err == nil && !ok {
		err = fmt.Errorf("phase data %q: %w", s.name, ErrNoValue)
	}
	return v, err
}
