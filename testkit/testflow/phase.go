package testflow

import (
	"context"

	"github.com/idemflow/idemflow/internal/phaserun"
	"github.com/idemflow/idemflow/phases"
)

// RunTx calls a tx phase's own function, for a test that wraps a phase with code of
// its own (reliability's first-phase prologues): phases does not export it.
func RunTx(ctx context.Context, p phases.Phase, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
	return phaserun.RunTx[*phases.Response](ctx, p, tx, run)
}
