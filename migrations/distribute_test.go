package migrations_test

import (
	"context"
	"fmt"
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
// with it; the outbox on the coordinator is added to Citus's metadata.
func TestDistributeConcurrently(t *testing.T) {
	t.Parallel()
	pgtest.SkipUnlessCitus(t)
	ctx := context.Background()
	db := pgtest.NewEmpty(t)
	require.NoError(t, migrations.Migrate(ctx, db.Pool))
	_, err := db.Pool.Exec(ctx, `CREATE TABLE orders (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id));
		CREATE TABLE outbox (id bigint PRIMARY KEY, tenant text NOT NULL)`)
	require.NoError(t, err)
	opts := &migrations.DistributeOptions{ColocateWith: "orders", Tables: []migrations.Table{{Name: "orders", Column: "tenant"}},
		Local: []string{"outbox"}}
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
	var local bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition
		WHERE logicalrelid = 'outbox'::regclass AND partmethod = 'n' AND repmodel = 's')`).Scan(&local))
	require.True(t, local, "the outbox is a Citus local table")
}

// ColocateWith "none" makes a new colocation group: the first application table starts
// it, the second and the key table join it, and no other table is in it (the decoy,
// distributed by text before them, holds the lowest-numbered group of their kind, the
// one "default" would pick).
func TestDistributeNewGroup(t *testing.T) {
	t.Parallel()
	pgtest.SkipUnlessCitus(t)
	ctx := context.Background()
	db := pgtest.NewEmpty(t)
	require.NoError(t, migrations.Migrate(ctx, db.Pool))
	_, err := db.Pool.Exec(ctx, `CREATE TABLE decoy (scope text NOT NULL);
		SELECT create_distributed_table('decoy', 'scope', colocate_with => 'default');
		CREATE TABLE orders (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id));
		CREATE TABLE refunds (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	opts := &migrations.DistributeOptions{ColocateWith: "none",
		Tables: []migrations.Table{{Name: "orders", Column: "tenant"}, {Name: "refunds", Column: "tenant"}}}
	require.NoError(t, migrations.Distribute(ctx, db.Pool, opts))
	var groups int
	var members []string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(DISTINCT p.colocationid),
	(SELECT array_agg(o.logicalrelid::text ORDER BY o.logicalrelid::text) FROM pg_dist_partition o
		WHERE o.colocationid = min(p.colocationid))
FROM pg_dist_partition p WHERE p.logicalrelid IN ('orders'::regclass, 'refunds'::regclass, 'idemflow_keys'::regclass)`).Scan(&groups, &members))
	require.Equal(t, 1, groups, "colocated")
	require.Equal(t, []string{"idemflow_keys", "orders", "refunds"}, members, "a group of their own")
}

// A key table distributed at an older version is migrated up, down to nothing and up
// again: on Citus every statement of every file runs on the distributed table.
func TestMigrateDistributed(t *testing.T) {
	t.Parallel()
	pgtest.SkipUnlessCitus(t)
	ctx := context.Background()
	all, err := migrations.All()
	require.NoError(t, err)
	fresh := pgtest.New(t) // migrated, then distributed
	want := objects(t, fresh.Pool)

	for from := 1; from < len(all); from++ {
		t.Run(fmt.Sprintf("From%d", from), func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewEmpty(t)
			require.NoError(t, migrations.MigrateTo(ctx, db.Pool, from))
			require.NoError(t, migrations.Distribute(ctx, db.Pool, nil))
			require.NoError(t, migrations.Migrate(ctx, db.Pool), "up from %d, distributed", from)
			require.Equal(t, want, objects(t, db.Pool))
			require.True(t, distributed(t, db), "still distributed")
			for to := len(all) - 1; to >= 1; to-- {
				require.NoError(t, migrations.MigrateTo(ctx, db.Pool, to), "down to %d, distributed", to)
				require.True(t, distributed(t, db))
			}
			require.NoError(t, migrations.Migrate(ctx, db.Pool), "up again")
			require.Equal(t, want, objects(t, db.Pool))
		})
	}
}

// distributed reports whether db's key table is a Citus distributed table.
func distributed(t *testing.T, db *pgtest.DB) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_dist_partition
		WHERE logicalrelid = 'idemflow_keys'::regclass AND partmethod = 'h')`).Scan(&ok))
	return ok
}
