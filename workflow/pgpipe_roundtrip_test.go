package workflow_test

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// TestPipelinedAfterLoser: a copy that loses its claim (the claim raises inside the
// phase's batch) leaves its connection's prepared statements alone, so the next fresh
// request on that connection takes the warm round trips, counted on the wire and by
// the tracer, in both statement-cache exec modes. (pgx's own batches forget every
// statement of a batch that failed: the next request would prepare them again.)
func TestPipelinedAfterLoser(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b, wire := loserSetup(t, mode)
			ctx := context.Background()
			fresh := func(key string) (trips, turns int64) {
				before, beforeWire := b.trips.trips.Load(), wire.Load()
				res, err := b.engine.Do(ctx, pipeReq(key, `{"a":1}`))
				require.NoError(t, err)
				require.Equal(t, http.StatusCreated, res.Response.Status)
				return b.trips.trips.Load() - before, wire.Load() - beforeWire
			}
			fresh("warm0")
			warmTrips, warmWire := fresh("warm1")
			require.EqualValues(t, 4, warmTrips, "look-up, reserve, settle's two")
			require.Equal(t, warmTrips, warmWire, "warm: no prepare on the wire")

			holder, err := b.db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer holder.Release()
			_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1::bigint # 'idemflow_keys'::regclass::oid::bigint)`,
				workflow.ClaimHash("acct", "lost"))
			require.NoError(t, err)
			res, err := b.engine.Do(ctx, pipeReq("lost", `{"a":1}`))
			require.False(t, err == nil && res.Response.Status == http.StatusCreated, "the copy must lose")
			_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
			require.NoError(t, err)

			trips, turns := fresh("after")
			require.Equal(t, warmTrips, trips, "round trips after a loser, by the tracer")
			require.Equal(t, warmWire, turns, "round trips after a loser, on the wire")
			require.EqualValues(t, 0, seqRuns(t, b.db)-6, "the loser ran none of the phase's statements")
		})
	}
}

// loserSetup is pipeSetup on a pool of one connection whose wire turns are counted.
func loserSetup(t *testing.T, mode pgx.QueryExecMode) (*pipeBundle, *atomic.Int64) {
	t.Helper()
	b := &pipeBundle{db: pgtest.New(t), trips: &tripCounter{}}
	_, err := b.db.Pool.Exec(context.Background(), pipeSchema)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ConnConfig.Tracer = b.trips
	wire := &atomic.Int64{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &turnConn{Conn: c, n: wire}, nil
	}
	b.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	b.engine, err = workflow.New(b.pool, nil)
	require.NoError(t, err)
	require.NoError(t, b.engine.Register(pipeFlow("pipe", &b.calls, nil)))
	require.NoError(t, workflow.StartUp(context.Background(), b.engine))
	return b, wire
}

// turnConn counts the turns of a connection's conversation: a write that follows a
// read (or is the first) starts a round trip.
type turnConn struct {
	net.Conn
	n     *atomic.Int64
	wrote atomic.Bool
}

func (c *turnConn) Write(p []byte) (int, error) {
	if !c.wrote.Swap(true) {
		c.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *turnConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.wrote.Store(false)
	}
	return n, err
}
