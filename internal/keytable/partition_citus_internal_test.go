package keytable

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestDetachBounded: the detach used on Citus (no DETACH … CONCURRENTLY there) gives
// up after its lock timeout while a transaction holds the key table, a few times, and
// leaves the partition attached; once the table is free it detaches. Run on plain
// PostgreSQL, where the statement is the same, and on Citus (IDEMFLOW_TEST_CITUS=1).
func TestDetachBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	s := New()
	require.NoError(t, s.SetupPartitioned(ctx, db.Pool, PartitionMinute, 3*time.Minute))
	l, err := s.layout(ctx, db.Pool)
	require.NoError(t, err)
	last := l.parts[len(l.parts)-1]

	// A request's transaction that read the key table and stays open.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT count(*) FROM idemflow_keys`)
	require.NoError(t, err)
	var holder int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder))

	stall, err := detachBounded(ctx, db.Pool, l, last)
	require.True(t, isPgCode(err, "55P03"), "lock timeout, after every try: %v", err)
	require.ErrorContains(t, err, fmt.Sprintf("the key table is held by pid %d (AccessShareLock, client backend,", holder),
		"the error names who holds the table")
	require.NotContains(t, err.Error(), "count(*)", "never a holder's query text")
	require.GreaterOrEqual(t, stall, citusDetachTimeout, "each try waited its lock timeout")
	parts, err := s.Partitions(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, parts, len(l.parts), "still attached")

	require.NoError(t, tx.Commit(ctx))
	_, err = detachBounded(ctx, db.Pool, l, last)
	require.NoError(t, err)
	parts, err = s.Partitions(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, parts, len(l.parts)-1, "detached")
}
