package workflow_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
)

// TestReviewPipelinedEncodeError: a value from the request that pgx cannot encode
// for its parameter (out of the column's range) fails the phase with that error,
// and changes nothing (pgpipe closes the connection then, as pgx does: its other
// statements were queued, unsent).
func TestReviewPipelinedEncodeError(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	require.NoError(t, b.engine.Register(phases.Flow{Name: "enc", Phases: []phases.Phase{
		phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(`INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'only', $3::int2)`,
				run.Scope(), run.Key(), int64(len(run.Body()))*1000)
			return phases.JSON(http.StatusCreated, "ok")
		}),
	}}))
	req := pipeReq("enc", `{"a":"`+string(make([]byte, 100))+`"}`)
	req.Flow = "enc"
	_, err := b.engine.Do(context.Background(), req)
	require.ErrorContains(t, err, "greater than maximum value for int2")
	require.Zero(t, countKeysOf(t, b, "enc"))
}
