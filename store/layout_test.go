package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestLayout drives the layout as a deployment does, through this package alone: a
// plain key table answers ErrNotPartitioned, SetupPartitioned moves it, and the
// partitions are then listed, checked, ensured and (past retention) removed.
func TestLayout(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: the layout on Citus is covered by TestPartitionsUnderTraffic (docs/PARTITIONS.md)")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	st := store.New()

	_, err := st.Partitions(ctx, db.Pool)
	require.ErrorIs(t, err, store.ErrNotPartitioned)
	_, err = st.CheckPartitions(ctx, db.Pool)
	require.ErrorIs(t, err, store.ErrNotPartitioned)
	_, err = st.EnsurePartitions(ctx, db.Pool, 0)
	require.ErrorIs(t, err, store.ErrNotPartitioned)

	require.NoError(t, st.SetupPartitioned(ctx, db.Pool, store.PartitionMinute, 3*time.Minute))
	parts, err := st.Partitions(ctx, db.Pool)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(parts), 4, "the current minute and three ahead")
	r, err := st.CheckPartitions(ctx, db.Pool)
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.Ahead, 3)
	require.Equal(t, 10, r.Want, "ten partitions ahead for widths under an hour")
	require.True(t, r.Low(), "three or four ahead of ten wanted")

	r, err = st.EnsurePartitions(ctx, db.Pool, 0)
	require.NoError(t, err)
	require.False(t, r.Busy)
	require.Positive(t, r.Created)
	r, err = st.CheckPartitions(ctx, db.Pool)
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.Ahead, 10)
	require.False(t, r.Low())
	r, err = st.RemovePartitions(ctx, db.Pool, 24*time.Hour)
	require.NoError(t, err)
	require.Zero(t, r.Removed, "nothing is past a day's retention")
	_, err = st.RemovePartitions(ctx, db.Pool, 0)
	require.Error(t, err, "a retention that is not positive")
}

// TestLayoutRefuses: a table with rows is not moved (ErrNotEmpty), and a schema name
// PostgreSQL cannot hold is refused before any statement.
func TestLayoutRefuses(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: the layout on Citus is covered by TestPartitionsUnderTraffic (docs/PARTITIONS.md)")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint, request_body)
VALUES ('acct', 'k', gen_random_uuid(), 'charge', 'POST', '/charges', '\x00', '')`)
	require.NoError(t, err)
	require.ErrorIs(t, store.New().SetupPartitioned(ctx, db.Pool, store.PartitionDay, 0), store.ErrNotEmpty)

	_, err = store.NewInSchema(strings.Repeat("s", 64))
	require.Error(t, err)
	st, err := store.NewInSchema("")
	require.NoError(t, err)
	_, err = st.Partitions(ctx, db.Pool)
	require.ErrorIs(t, err, store.ErrNotPartitioned)
}
