package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// Without the citus extension Distribute says so and changes nothing.
func TestDistributeWithoutCitus(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: the shared server is a Citus cluster")
	}
	db := pgtest.New(t)
	err := migrations.Distribute(context.Background(), db.Pool, nil)
	require.ErrorIs(t, err, migrations.ErrNoCitus)
	require.ErrorContains(t, err, "CREATE EXTENSION citus")
}

// On Citus, processes that start at once all distribute: the first does it, the others
// find it done. The application's table comes first and the key table is colocated
// with it.
func TestDistributeConcurrently(t *testing.T) {
	t.Parallel()
	if !pgtest.CitusMode() {
		t.Skip("skipped: needs a Citus cluster (set " + pgtest.EnvCitus + "=1 where Citus is installed)")
	}
	ctx := context.Background()
	db := pgtest.NewEmpty(t)
	require.NoError(t, migrations.Migrate(ctx, db.Pool))
	_, err := db.Pool.Exec(ctx, `CREATE TABLE orders (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	opts := &migrations.DistributeOptions{ColocateWith: "orders", Tables: []migrations.Table{{Name: "orders", Column: "tenant"}}}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = migrations.Distribute(ctx, db.NewPool(t), opts)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, migrations.Distribute(ctx, db.Pool, opts), "again: nothing to do")
	var tables, groups int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT colocationid) FROM pg_dist_partition
		WHERE logicalrelid IN ('orders'::regclass, 'idemflow_keys'::regclass)`).Scan(&tables, &groups))
	require.Equal(t, 2, tables)
	require.Equal(t, 1, groups, "colocated")
}
