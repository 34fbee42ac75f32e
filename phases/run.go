package phases

import (
	"encoding/json"
	"errors"
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

// Body is the request body decoded into a T once per attempt: the first phase of the
// attempt that asks decodes it, and every later phase of the same attempt that asks
// gets that result (the value or the error) without decoding again. A flow whose
// phases each need the request (the first to write it, a call phase to send it, the
// last to answer with it) reads it this way instead of parsing the body in each.
//
// decode must be deterministic, as a fingerprinted request is the same bytes on every
// attempt: a resumed attempt, or the sweeper's, decodes the body again and must get the
// same value. The value is shared by the attempt's phases, not copied: treat it as
// read-only (a T holding maps, slices or pointers hands each phase the same ones). A
// value that a later attempt needs whatever the body says belongs in a Slot instead.
type Body[T any] struct {
	decode func([]byte) (T, error)
}

// NewBody returns the Body decoded by decode. Each NewBody is a Body of its own, kept
// apart from every other in a run: make it once, next to the flow, not in a phase.
func NewBody[T any](decode func(body []byte) (T, error)) *Body[T] {
	return &Body[T]{decode: decode}
}

// decoded is a Body's result as an attempt keeps it.
type decoded[T any] struct {
	v   T
	err error
}

// Get returns the request body of r decoded by b's decode function: decoded now if
// no phase of this attempt asked b before, else the result it got then.
func (b *Body[T]) Get(r *Run) (T, error) {
	if b == nil || b.decode == nil {
		var zero T
		return zero, errors.New("phases: a Body not made by NewBody")
	}
	if m, ok := r.state().Memo(b); ok {
		d := m.(*decoded[T])
		return d.v, d.err
	}
	d := &decoded[T]{}
	d.v, d.err = b.decode(r.Body())
	r.state().SetMemo(b, d)
	return d.v, d.err
}
