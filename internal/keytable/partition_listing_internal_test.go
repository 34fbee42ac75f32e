package keytable

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// detachBeforeOrphans is a pool whose first listing of the layout's orphans comes
// after another process's detach of the partition name: the layout's two listings
// then both hold it, attached in the first, detached in the second.
type detachBeforeOrphans struct {
	*pgxpool.Pool
	t    *testing.T
	name string
	done bool
}

func (d *detachBeforeOrphans) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if sql == sqlPartitionOrphans && !d.done {
		d.done = true
		_, err := d.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+d.name)
		require.NoError(d.t, err, "the other process's detach")
	}
	return d.Pool.Query(ctx, sql, args...)
}

// TestRemovePartitionsDetachedBetweenListings: a partition past retention is detached
// by another process between the layout's listing of partitions and its listing of
// detached tables. The removal drops it once and counts it once (before, it counted it
// Contended as a partition whose detach failed, and Removed as a detached table).
func TestRemovePartitionsDetachedBetweenListings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	s := New()
	require.NoError(t, s.SetupPartitioned(ctx, db.Pool, PartitionMinute, 3*time.Minute))
	var now time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT date_trunc('minute', statement_timestamp())`).Scan(&now))
	from := now.Add(-53 * time.Minute)
	name := partitionName(from, time.Minute)
	// Two statements: a Citus coordinator refuses to attach a table to a distributed one
	// in the statement string that created it.
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+name+` (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys ATTACH PARTITION `+name+` FOR VALUES FROM (`+
		boundLiteral(from)+`) TO (`+boundLiteral(from.Add(time.Minute))+`)`)
	require.NoError(t, err)

	db2 := &detachBeforeOrphans{Pool: db.Pool, t: t, name: name}
	r, err := s.RemovePartitions(ctx, db2, 10*time.Minute)
	require.NoError(t, err)
	require.True(t, db2.done, "the detach ran between the listings")
	require.Equal(t, [3]int{1, 0, 0}, [3]int{r.Removed, r.Contended, r.Kept}, "removed once, counted once: %+v", r)
	var gone bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, name).Scan(&gone))
	require.True(t, gone, "dropped")
}
