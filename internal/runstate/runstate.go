// Package runstate is the state of one run of a flow on a key, as the engine keeps it:
// the key's identity and request, the phase being run (which names the derived key), and
// the phase data carried between phases, with the changes of the current phase undone
// on failure.
//
// A phases.Run is a Run (package phases declares `type Run runstate.Run`), so the
// engine converts between the two, (*runstate.Run)(run) and (*phases.Run)(state),
// with no registry and no interface in between. A phase function, outside this module,
// cannot import this package: it sees only phases.Run's readers and cannot enter
// another phase (and so change its own derived key) or undo phase data.
//
// This package imports none of idemflow's packages.
package runstate

import (
	"encoding/json"
	"fmt"
	"maps"
)

// Info identifies the key a run works on. The engine fills it in from the request or
// the key row.
type Info struct {
	Scope   string
	Key     string
	ID      string // the key row's identity; derived keys are built from it
	Flow    string
	Method  string
	Route   string
	Body    []byte
	Attempt int // 1 for the first attempt, incremented by each takeover
}

// Run is the state of a run. Its fields are unexported so that phases.Run, which has
// the same underlying type, shows none of them.
type Run struct {
	info  Info
	phase string
	data  map[string]json.RawMessage
	saved map[string]json.RawMessage
}

// New returns a run with the stored phase data (a JSON object, or empty), or an error
// if the data is not a JSON object.
func New(info Info, data []byte) (*Run, error) {
	r := &Run{info: info, data: map[string]json.RawMessage{}}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &r.data); err != nil {
			return nil, fmt.Errorf("decode phase data: %w", err)
		}
	}
	return r, nil
}

// Info is the key the run works on. Do not modify it.
func (r *Run) Info() *Info { return &r.info }

// Phase is the name of the phase being run, empty before the first Enter.
func (r *Run) Phase() string { return r.phase }

// Enter marks the start of a phase: Phase names it (and so the derived key), and
// changes to the phase data made from here on are undone by Revert.
func (r *Run) Enter(phase string) {
	r.phase = phase
	r.saved = maps.Clone(r.data)
}

// Revert undoes the phase data changes made since the last Enter.
func (r *Run) Revert() { r.data = maps.Clone(r.saved) }

// Value returns the encoded value stored under name and whether there is one.
func (r *Run) Value(name string) (json.RawMessage, bool) {
	b, ok := r.data[name]
	return b, ok
}

// SetValue stores the encoded value b under name.
func (r *Run) SetValue(name string, b json.RawMessage) { r.data[name] = b }

// Data encodes the phase data as a JSON object.
func (r *Run) Data() ([]byte, error) {
	b, err := json.Marshal(r.data)
	if err != nil {
		return nil, fmt.Errorf("encode phase data: %w", err)
	}
	return b, nil
}
