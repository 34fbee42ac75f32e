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
	"slices"
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
	saved map[string]json.RawMessage // data at the last Enter, once changed since
	dirty bool                       // data changed since the last Enter (saved holds it)
	memo  []memo                     // values kept for the attempt (Memo, SetMemo)
}

// memo is a value a run keeps for the rest of its attempt, under a key of its
// maker's choosing.
type memo struct{ key, val any }

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
// The data is copied at the first change after Enter, not at Enter: most phases change
// none of it.
func (r *Run) Enter(phase string) {
	r.phase = phase
	r.saved, r.dirty = nil, false
}

// Revert undoes the phase data changes made since the last Enter.
func (r *Run) Revert() {
	if r.dirty {
		r.data, r.saved, r.dirty = r.saved, nil, false
	}
}

// Value returns the encoded value stored under name and whether there is one.
func (r *Run) Value(name string) (json.RawMessage, bool) {
	b, ok := r.data[name]
	return b, ok
}

// SetValue stores the encoded value b under name.
func (r *Run) SetValue(name string, b json.RawMessage) {
	if !r.dirty {
		r.saved, r.dirty = maps.Clone(r.data), true
	}
	r.data[name] = b
}

// Memo returns the value kept under key by SetMemo in this attempt, and whether there
// is one. Memos are not phase data: they are neither stored nor undone by Revert, and
// a takeover's run starts without them.
func (r *Run) Memo(key any) (any, bool) {
	for _, m := range r.memo {
		if m.key == key {
			return m.val, true
		}
	}
	return nil, false
}

// SetMemo keeps val under key (a comparable value) for the rest of the attempt.
func (r *Run) SetMemo(key, val any) {
	for i := range r.memo {
		if r.memo[i].key == key {
			r.memo[i].val = val
			return
		}
	}
	r.memo = append(r.memo, memo{key, val})
}

// Data encodes the phase data as a JSON object, as json.Marshal does.
func (r *Run) Data() ([]byte, error) {
	if b, ok := plainData(r.data); ok {
		return b, nil
	}
	b, err := json.Marshal(r.data)
	if err != nil {
		return nil, fmt.Errorf("encode phase data: %w", err)
	}
	return b, nil
}

// plainData is json.Marshal's encoding of data in one allocation, for the usual phase
// data: names of printable ASCII and values of valid JSON with no whitespace and
// nothing json.Marshal escapes or compacts (no '<', '>', '&' and no byte of U+2028 or
// U+2029). It reports false for any other: json.Marshal encodes it (or refuses it).
func plainData(data map[string]json.RawMessage) ([]byte, bool) {
	if data == nil {
		return nil, false // json.Marshal writes null
	}
	names := make([]string, 0, 8)
	n := 2 // {}
	for name, v := range data {
		if !plainName(name) || !plainValue(v) {
			return nil, false
		}
		names = append(names, name)
		n += len(name) + 3 + len(v) + 1 // "name":v,
	}
	slices.Sort(names)
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		b = append(b, data[name]...)
	}
	return append(b, '}'), true
}

// plainName reports whether json.Marshal writes name as it is, between quotes.
func plainName(name string) bool {
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// plainValue reports whether json.Marshal writes v as it is: valid JSON, compact, with
// nothing it escapes.
func plainValue(v json.RawMessage) bool {
	for _, c := range v {
		switch c {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xe2:
			return false
		}
	}
	return len(v) > 0 && json.Valid(v)
}
