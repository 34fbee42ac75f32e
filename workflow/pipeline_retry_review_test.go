package workflow_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
)

// flakySchema: review_flaky raises a serialization failure (40001) on its first two
// calls; the sequence it counts with is not rolled back.
const flakySchema = `CREATE SEQUENCE review_flaky_seq;
CREATE FUNCTION review_flaky() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('review_flaky_seq') <= 2 THEN
		RAISE EXCEPTION 'flaky' USING ERRCODE = '40001';
	END IF;
	RETURN 1;
END $$`

// TestReviewPipelinedConflictRetried: a statement of a one-round-trip pipelined phase
// (an implicit transaction) that fails with a serialization failure is retried as
// Config.TxRetries says, and the key ends with one effect.
func TestReviewPipelinedConflictRetried(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	_, err := b.pool.Exec(context.Background(), flakySchema)
	require.NoError(t, err)
	insert := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'only', $3)`
	require.NoError(t, b.engine.Register(phases.Flow{Name: "flaky", Phases: []phases.Phase{
		phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(insert, run.Scope(), run.Key(), 1)
			p.Queue(`SELECT review_flaky()`)
			return phases.JSON(http.StatusCreated, "ok")
		}),
	}}))
	req := pipeReq("flaky", `{}`)
	req.Flow = "flaky"
	_, err = b.engine.Do(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, 1, countKeysOf(t, b, "flaky"))
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pipe_effects`).Scan(&n))
	require.Equal(t, 1, n)
}
