package testflow

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// RunChild is the work of a child process that a test starts from its own binary to
// be a real server it can pause or kill: it connects to dbURL, registers the flow with
// its calls going to providerURL and before run at the start of every phase, and runs
// req (admission waits as long as ctx: SlowMachine). The error is the attempt's, or
// the setup's; the pool is closed on return.
func RunChild(ctx context.Context, dbURL, providerURL string, before func(ctx context.Context, tx phases.DBTX, run *phases.Run) error, req workflow.Request) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	e, err := workflow.New(pool, SlowMachine(nil))
	if err != nil {
		return err
	}
	if err := e.Register(Flow(Options{ProviderURL: providerURL, Before: before})); err != nil {
		return err
	}
	_, err = e.Do(ctx, req)
	return err
}
