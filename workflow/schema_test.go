package workflow_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestSchemas runs two engines on two schemas of one database, through one pool whose
// search_path is a third schema with a key table of its own, which must stay empty:
// every statement names its schema (a claim lock too), and neither engine nor its
// sweeper sees the other's keys.
func TestSchemas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t) // the flow's tables, a key table, and the search_path
	schemaA, schemaB := db.Schema+` "a"`, db.Schema+`'b`
	dropSchemasAtCleanup(t, db.Pool, schemaA, schemaB)
	engine := func(schema string, before func(context.Context, phases.DBTX, *phases.Run) error) *workflow.Engine {
		m, err := migrations.NewMigrator(&migrations.Config{Schema: schema})
		require.NoError(t, err)
		require.NoError(t, m.Migrate(ctx, db.Pool))
		return testflow.Engine(t, db.Pool, &workflow.Config{Schema: schema}, p, before)
	}
	inReserve, release := make(chan struct{}), make(chan struct{})
	a := engine(schemaA, nil)
	holdA := testflow.Engine(t, db.Pool, &workflow.Config{Schema: schemaA}, p, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Reserve && run.Key() == "held" {
			close(inReserve)
			<-release
		}
		return nil
	})
	b := engine(schemaB, nil)

	t.Run("KeysAreApart", func(t *testing.T) {
		_, err := a.Do(ctx, chargeReq("acct", "k", `{"amount":1}`))
		require.NoError(t, err)
		res, err := b.Do(ctx, chargeReq("acct", "k", `{"amount":2}`))
		require.NoError(t, err, "the same key in the other schema is not a mismatch")
		require.False(t, res.Replayed)
		res, err = a.Do(ctx, chargeReq("acct", "k", `{"amount":1}`))
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, 1, keysIn(t, db.Pool, schemaA))
		require.Equal(t, 1, keysIn(t, db.Pool, schemaB))
	})

	t.Run("ClaimLocksAreApart", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := holdA.Do(ctx, chargeReq("acct", "held", `{"amount":3}`))
			done <- err
		}()
		select {
		case <-inReserve:
		case err := <-done:
			t.Fatalf("the holder ended before its first phase: %v", err)
		}
		// A holds the key's claim lock in its first transaction; B claims the same key.
		res, err := b.Do(ctx, chargeReq("acct", "held", `{"amount":3}`))
		close(release)
		require.NoError(t, err, "a claim in one schema does not block the same key in another")
		require.Equal(t, 201, res.Response.Status)
		require.NoError(t, <-done)
	})

	t.Run("SweepersAreApart", func(t *testing.T) {
		p.FailNext(1)
		_, err := b.Do(ctx, chargeReq("acct", "stuck", `{"amount":4}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
		_, err = db.Pool.Exec(ctx, `UPDATE `+pgx.Identifier{schemaB, "idemflow_keys"}.Sanitize()+`
			SET created_at = statement_timestamp() - interval '1 hour', next_attempt_at = statement_timestamp() - interval '1 millisecond'
			WHERE status = 'in_progress'`)
		require.NoError(t, err)
		st, err := a.Sweep(ctx, &workflow.SweeperConfig{Grace: -1})
		require.NoError(t, err)
		require.Zero(t, st.Taken, "A's sweeper leaves B's keys alone")
		st, err = b.Sweep(ctx, &workflow.SweeperConfig{Grace: -1})
		require.NoError(t, err)
		require.Equal(t, 1, st.Finished)
	})

	require.Zero(t, testflow.CountKeys(t, db.Pool), "nothing went to the search_path's key table")
}

// dropSchemasAtCleanup drops the schemas when the test ends.
func dropSchemasAtCleanup(t *testing.T, pool *pgxpool.Pool, schemas ...string) {
	t.Helper()
	t.Cleanup(func() {
		for _, s := range schemas {
			_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
			require.NoError(t, err)
		}
	})
}

// keysIn counts the key rows of schema's key table.
func keysIn(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, "idemflow_keys"}.Sanitize()).Scan(&n))
	return n
}

func TestSchemaRefused(t *testing.T) {
	t.Parallel()
	var pool struct{ workflow.Pool } // never reached: the config is refused first
	for _, schema := range []string{strings.Repeat("s", 64), "a\x00b"} {
		_, err := workflow.New(pool, &workflow.Config{Schema: schema})
		require.ErrorContains(t, err, "workflow: Schema")
		_, err = migrations.NewMigrator(&migrations.Config{Schema: schema})
		require.Error(t, err)
	}
}
