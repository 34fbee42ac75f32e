package phases

import (
	"context"

	"github.com/idemflow/idemflow/internal/phaserun"
)

// The engine's access to runs and phases goes through internal/phaserun, so that none
// of it is on Run's or Phase's API: a phase function cannot enter another phase (and so
// change its own derived key), undo phase data or call other phases.
func init() {
	phaserun.Register(phaserun.Funcs{
		NewRun: func(info phaserun.Info, data []byte) (any, error) { return newRun(info, data) },
		Enter:  func(run any, phase string) { run.(*Run).enter(phase) },
		Revert: func(run any) { run.(*Run).revert() },
		Data:   func(run any) ([]byte, error) { return run.(*Run).marshalData() },
		RunTx: func(ctx context.Context, phase, tx, run any) (any, error) {
			var db DBTX // a nil tx stays nil, for tests of phases that do not use it
			if tx != nil {
				db = tx.(DBTX)
			}
			return phase.(Phase).runTx(ctx, db, run.(*Run))
		},
		RunCall: func(ctx context.Context, phase, run any) (any, error) {
			return phase.(Phase).runCall(ctx, run.(*Run))
		},
	})
}
