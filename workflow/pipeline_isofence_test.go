package workflow_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestPipelinedIsolationFenceFirst: at a database default of repeatable read, an
// engine whose first pipelined batch is the fence of an existing key (it resumes a
// key another engine started) still runs the phase at READ COMMITTED: the fence
// checks the level before it scans or locks anything, and the engine sends BEGIN from
// then on. The claim's check does not help here: this engine never claims.
func TestPipelinedIsolationFenceFirst(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: a worker's transaction is read committed whatever the coordinator's default")
	}
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	_, err := db.Pool.Exec(ctx, pipeSchema+`ALTER DATABASE `+pgx.Identifier{dbName(t, db)}.Sanitize()+
		` SET default_transaction_isolation = 'repeatable read'`)
	require.NoError(t, err)
	var down atomic.Bool
	down.Store(true)
	iso := isoFlow()
	flow := phases.Flow{Name: "isoresume", Phases: []phases.Phase{
		iso.Phases[0],
		phases.Call("provider", func(context.Context, *phases.Run) (*phases.Response, error) {
			if down.Load() {
				return nil, errors.New("provider down")
			}
			return nil, nil
		}),
		iso.Phases[1],
	}}
	req := pipeReq("resumed", `{}`)
	req.Flow = flow.Name

	first := pipeSetupOn(t, &pipeBundle{db: db, trips: &tripCounter{}}, pgx.QueryExecModeCacheStatement, db.URL)
	require.NoError(t, first.engine.Register(flow))
	res, err := first.engine.Do(ctx, req)
	require.Falsef(t, err == nil && res.Response.Status == http.StatusCreated, "the first attempt stops at the provider")

	down.Store(false)
	second := pipeSetupOn(t, &pipeBundle{db: db, trips: &tripCounter{}}, pgx.QueryExecModeCacheStatement, db.URL)
	require.NoError(t, second.engine.Register(flow))
	res, err = second.engine.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)

	rows, err := db.Pool.Query(ctx, `SELECT n, phase FROM pipe_effects WHERE idem_key = 'resumed' ORDER BY n`)
	require.NoError(t, err)
	effects, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		N     int64
		Phase string
	}])
	require.NoError(t, err)
	require.Len(t, effects, 2, "one effect per phase")
	for _, e := range effects {
		require.Equal(t, "read committed", e.Phase, "the level phase %d's statement ran at", e.N)
	}
}
