package phases

import (
	"context"
	"fmt"
)

// CompensateFunc is the body of a flow's compensation: it undoes, on tx, what the
// flow's committed tx phases wrote. reached is the key's recovery point when it is
// cancelled: every tx phase at or before it committed, none after it did (Started:
// none). run reads the key as its phases see it: its identity, request body and phase
// data (slots). Returning an error rolls back the compensation and the cancel: the key
// stays as it was.
type CompensateFunc func(ctx context.Context, tx DBTX, run *Run, reached string) error

// Compensation is what an operator's cancel of a key runs (workflow.Engine.CancelKey):
// a tx phase of its own, run in the same transaction as the cancel's write of the key
// row and fenced like any tx phase, so that the undo and the cancel commit together
// or not at all. Build it with Compensate. The zero value is no compensation: a cancel
// then leaves the committed phases' writes as they are.
type Compensation struct {
	// Name names the compensation to operators ("will run compensation NAME"), and is
	// the phase Run.Phase reports while it runs. Same rules as a phase name.
	Name string
	// Func is the compensation's function; nil means the flow has none.
	Func CompensateFunc `json:"-"`
}

// Compensate returns a compensation.
func Compensate(name string, fn CompensateFunc) Compensation {
	return Compensation{Name: name, Func: fn}
}

// validate checks the compensation of flow f, when it has one.
func (c Compensation) validate(f Flow) error {
	if c.Func == nil {
		if c.Name != "" {
			return fmt.Errorf("%w: flow %q: compensation %q has no function (build it with phases.Compensate)", ErrInvalidFlow, f.Name, c.Name)
		}
		return nil
	}
	if !nameRE.MatchString(c.Name) || c.Name == Started || c.Name == Finished {
		return fmt.Errorf("%w: flow %q: compensation name %q: want 1-64 of [a-z0-9_.-], starting with a letter, not reserved", ErrInvalidFlow, f.Name, c.Name)
	}
	for _, p := range f.Phases {
		if p.Name == c.Name {
			return fmt.Errorf("%w: flow %q: compensation %q has a phase's name", ErrInvalidFlow, f.Name, c.Name)
		}
	}
	return nil
}
