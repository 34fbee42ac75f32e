package workflow_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
)

// TestReviewPipelinedLock: LOCK, which the server runs only inside a transaction
// block (25P01 in an implicit transaction), works in a pipelined phase as it did when
// every phase began with BEGIN, and makes one effect.
func TestReviewPipelinedLock(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	insert := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'only', $3)`
	require.NoError(t, b.engine.Register(phases.Flow{Name: "lock", Phases: []phases.Phase{
		phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(`LOCK TABLE pipe_effects IN SHARE ROW EXCLUSIVE MODE`)
			p.Queue(insert, run.Scope(), run.Key(), 1)
			return phases.JSON(http.StatusCreated, "locked")
		}),
	}}))
	req := pipeReq("lock", `{}`)
	req.Flow = "lock"
	_, err := b.engine.Do(context.Background(), req)
	require.NoError(t, err)
	_, err = b.engine.Do(context.Background(), req)
	require.NoError(t, err, "a replay")
	require.Equal(t, 1, countKeysOf(t, b, "lock"))
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pipe_effects`).Scan(&n))
	require.Equal(t, 1, n, "one effect: the implicit batch that LOCK refused rolled back whole")
}
