package workflow_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
)

// TestReviewPipelinedTxControl: a pipelined phase whose statements include a
// transaction-control statement (here COMMIT between an insert and one that fails)
// must not leave the key answered: its phase failed, so no key row, and a replay must
// not return the phase's answer.
func TestReviewPipelinedTxControl(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	insert := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'only', $3)`
	require.NoError(t, b.engine.Register(phases.Flow{Name: "txctl", Phases: []phases.Phase{
		phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(insert, run.Scope(), run.Key(), 1)
			p.Queue(`COMMIT`)
			p.Queue(insert, run.Scope(), run.Key(), -1) // the CHECK refuses it
			return phases.JSON(http.StatusCreated, "never")
		}),
	}}))
	req := pipeReq("txctl", `{}`)
	req.Flow = "txctl"
	_, err := b.engine.Do(context.Background(), req)
	require.ErrorIs(t, err, phases.ErrTxManaged)
	require.Zero(t, countKeysOf(t, b, "txctl"), "the phase failed: its key row must not be committed")
	require.Zero(t, seqRuns(t, b.db), "refused before anything was sent")
}

// TestReviewPipelinedProcCommit: a procedure that commits, run by a pipelined phase
// (DO or CALL: non-atomic outside a transaction block), must not commit the claim
// and the key row's write ahead of a statement that fails after it.
func TestReviewPipelinedProcCommit(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	insert := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'only', $3)`
	require.NoError(t, b.engine.Register(phases.Flow{Name: "docommit", Phases: []phases.Phase{
		phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(insert, run.Scope(), run.Key(), 1)
			p.Queue(`DO $$ BEGIN COMMIT; END $$`)
			p.Queue(insert, run.Scope(), run.Key(), -1) // the CHECK refuses it
			return phases.JSON(http.StatusCreated, "never")
		}),
	}}))
	req := pipeReq("docommit", `{}`)
	req.Flow = "docommit"
	_, err := b.engine.Do(context.Background(), req)
	require.Error(t, err)
	require.Zero(t, countKeysOf(t, b, "docommit"), "the phase failed: its key row must not be committed")
}
