package workflow_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/coretest"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
)

// TestQueryExecModes runs the core cases on each of pgx's query exec modes, each case in
// a schema of its own, straight on Postgres.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			coretest.Run(t, func(t *testing.T) *coretest.Env {
				db, p := testflow.Start(t)
				pool := poolInMode(t, db, mode)
				return &coretest.Env{Pool: pool, DB: pool, Provider: p}
			})
		})
	}
}

// poolInMode opens a pool on db's schema whose statements go in mode.
func poolInMode(t *testing.T, db *pgtest.DB, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
