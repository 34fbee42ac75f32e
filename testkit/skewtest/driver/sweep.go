package main

import (
	"context"
	"github.com/idemflow/idemflow/workflow"
)

// sweep runs one sweeper pass with no grace and one attempt per key. The skew test
// replaces this file with the previous release's version of it (previousSweep).
func sweep(ctx context.Context, e *workflow.Engine) (workflow.SweepStats, error) {
	return e.Sweep(ctx, &workflow.SweeperConfig{Grace: -1, MaxAttempts: 1})
}
