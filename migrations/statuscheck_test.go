package migrations_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestStatusCheckOnPartitions: 004 reaches every partition of a key table partitioned
// before it, those the set-up created and those the maintenance created and attached
// later alike, and going back to 003 puts the two state checks back on each of them
// and on the partitions created after. Only the status check is left with 004: a
// partition that kept the others would go on paying for them on every write.
func TestStatusCheckOnPartitions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewEmpty(t)
	st := store.New()
	require.NoError(t, migrations.MigrateTo(ctx, db.Pool, 3))
	require.NoError(t, st.SetupPartitioned(ctx, db.Pool, store.PartitionHour, 2*time.Hour))
	_, err := st.EnsurePartitions(ctx, db.Pool, 6*time.Hour) // created, then attached
	require.NoError(t, err)

	// checks lists, for the key table and each partition, its CHECK constraints.
	checks := func() map[string][]string {
		out := map[string][]string{}
		rows, err := db.Pool.Query(ctx, `SELECT c.relname, coalesce(array_agg(k.conname ORDER BY k.conname)
				FILTER (WHERE k.conname IS NOT NULL), '{}')
			FROM pg_class c
			LEFT JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'c'
			WHERE c.oid = 'idemflow_keys'::regclass
				OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idemflow_keys'::regclass)
			GROUP BY c.relname`)
		require.NoError(t, err)
		var name string
		var names []string
		_, err = pgx.ForEachRow(rows, []any{&name, &names}, func() error {
			out[name] = names
			return nil
		})
		require.NoError(t, err)
		return out
	}
	three := []string{"idemflow_keys_finished", "idemflow_keys_response_status", "idemflow_keys_status"}
	before := checks()
	require.Greater(t, len(before), 6, "the table and its partitions, some attached by the maintenance")
	for rel, names := range before {
		require.Equal(t, three, names, "%s at 003", rel)
	}

	require.NoError(t, migrations.Migrate(ctx, db.Pool))
	for rel, names := range checks() {
		require.Equal(t, []string{"idemflow_keys_status"}, names, "%s at 004", rel)
	}

	require.NoError(t, migrations.MigrateTo(ctx, db.Pool, 3))
	_, err = st.EnsurePartitions(ctx, db.Pool, 12*time.Hour)
	require.NoError(t, err)
	after := checks()
	require.Greater(t, len(after), len(before), "partitions created after going back")
	for rel, names := range after {
		require.Equal(t, three, names, "%s back at 003", rel)
	}
}
