package otelsdk_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestLayoutUnknownMetric: the engine's failed check of the key table's layout (the
// backend of its first pooled connection terminated) is counted as the key event
// layout_unknown, once; the check is tried again later and the next requests succeed.
func TestLayoutUnknownMetric(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	var armed atomic.Bool
	armed.Store(true)
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if !armed.CompareAndSwap(true, false) {
			return true, nil
		}
		var gone bool // pg_terminate_backend waits, up to its timeout, for the backend to exit
		err := b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1::int, 60000::bigint)`, c.PgConn().PID()).Scan(&gone)
		if err == nil && !gone {
			err = fmt.Errorf("backend %d did not exit", c.PgConn().PID())
		}
		return true, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := testflow.Engine(t, pool, &workflow.Config{Hooks: b.obs.Hooks()}, b.provider, nil)

	_, err = e.Do(ctx, req("first", `{"amount":1}`))
	require.Error(t, err, "the first request ran on a terminated connection")
	require.EqualValues(t, 1, points(t, b, "idemflow.key.events")["idemflow.event=layout_unknown"])
	res, err := e.Do(ctx, req("second", `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.EqualValues(t, 1, points(t, b, "idemflow.key.events")["idemflow.event=layout_unknown"], "reported once per failed check")
}
