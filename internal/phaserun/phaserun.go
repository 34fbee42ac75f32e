// Package phaserun is the engine's access to the parts of a phases.Run and a
// phases.Phase that a phase function must not reach: making a run from a key row,
// entering a phase (which sets the run's derived key), undoing a failed phase's changes
// to the phase data, encoding the phase data, and calling a phase's function. Package
// phases implements them and registers the implementation from an init function
// (Register); workflow calls them. Being internal, none of it is part of idemflow's API.
//
// Values of phases' types pass through as any, so that phases can import this package
// without a cycle; the registered functions assert them back and panic on a value of
// another type, which is a bug in the engine. The generic functions assert the results.
//
//	run, err := phaserun.NewRun[*phases.Run](phaserun.Info{ID: id, Attempt: 1}, data)
//	phaserun.Enter(run, p.Name)
//	resp, err := phaserun.RunTx[*phases.Response](ctx, p, tx, run)
//
// This package imports none of idemflow's packages.
package phaserun

import "context"

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

// Funcs are the implementations package phases registers. Every run, phase and tx
// argument is a *phases.Run, a phases.Phase and a phases.DBTX; every response returned
// is a *phases.Response, possibly nil.
type Funcs struct {
	// NewRun returns a *phases.Run with the stored phase data (a JSON object, or empty).
	NewRun func(info Info, data []byte) (run any, err error)
	// Enter marks the start of a phase: the run's Phase and DerivedKey name it, and
	// changes to the phase data made from here on are undone by Revert.
	Enter func(run any, phase string)
	// Revert undoes the phase data changes made since the last Enter.
	Revert func(run any)
	// Data encodes the phase data as a JSON object.
	Data func(run any) ([]byte, error)
	// RunTx calls a tx phase's function.
	RunTx func(ctx context.Context, phase, tx, run any) (resp any, err error)
	// RunCall calls a call phase's function.
	RunCall func(ctx context.Context, phase, run any) (resp any, err error)
}

var funcs Funcs

// Register sets the implementation. Package phases calls it once, from an init
// function, so it is set before any package that imports phases runs.
func Register(f Funcs) { funcs = f }

// NewRun returns a run (R is *phases.Run) with the stored phase data, or an error if
// the data is not a JSON object.
func NewRun[R any](info Info, data []byte) (R, error) {
	v, err := funcs.NewRun(info, data)
	if err != nil {
		var zero R
		return zero, err
	}
	return v.(R), nil
}

// Enter marks the start of the named phase on run: its derived key is the phase's from
// here on, and Revert undoes the phase data changes made after it.
func Enter(run any, phase string) { funcs.Enter(run, phase) }

// Revert undoes the phase data changes made on run since the last Enter.
func Revert(run any) { funcs.Revert(run) }

// Data encodes run's phase data as a JSON object.
func Data(run any) ([]byte, error) { return funcs.Data(run) }

// RunTx calls the function of phase, a tx phase, with tx and run. Resp is
// *phases.Response. A panic in the function is not recovered here.
func RunTx[Resp any](ctx context.Context, phase, tx, run any) (Resp, error) {
	v, err := funcs.RunTx(ctx, phase, tx, run)
	return v.(Resp), err
}

// RunCall calls the function of phase, a call phase, with run. Resp is
// *phases.Response. A panic in the function is not recovered here.
func RunCall[Resp any](ctx context.Context, phase, run any) (Resp, error) {
	v, err := funcs.RunCall(ctx, phase, run)
	return v.(Resp), err
}
