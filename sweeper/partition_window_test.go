package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/workflow"
)

// TestSweeperPartitionRemovalWindow: with SweeperConfig.PartitionRemoval, a pass
// removes a partition past retention only when the database clock is in the window;
// outside it the pass still creates partitions ahead, and the partition and its key
// stay. The windows are placed around the database clock's time of day, hours away
// from it, so that the pass cannot cross their edges.
func TestSweeperPartitionRemovalWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPartitioned(t)
	old, from := addMinutePartition(t, b.db, -30)
	insertFinishedAt(t, b.db, "old-finished", from)
	var now time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now))
	day := func(d time.Duration) time.Duration { return ((d % (24 * time.Hour)) + 24*time.Hour) % (24 * time.Hour) }
	clock := now.UTC().Sub(now.UTC().Truncate(24 * time.Hour)).Truncate(time.Minute)
	elsewhere := workflow.DailyWindow{From: day(clock + 3*time.Hour), To: day(clock + 5*time.Hour)}
	here := workflow.DailyWindow{From: day(clock - 2*time.Hour), To: day(clock + 2*time.Hour)}
	attached := func() []string {
		parts, err := store.New().Partitions(ctx, b.db.Pool)
		require.NoError(t, err)
		var names []string
		for _, p := range parts {
			names = append(names, p.Name)
		}
		return names
	}

	st, err := b.newSweeper(t, &workflow.SweeperConfig{Retention: 10 * time.Minute, PartitionRemoval: elsewhere}).RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Partitions.Removed, "outside the window (%s, the clock at %s): nothing removed", elsewhere, now.UTC())
	require.GreaterOrEqual(t, st.Partitions.Ahead, 10, "partitions ahead created all the same")
	require.Contains(t, attached(), old)
	require.Equal(t, 1, keyRows(t, b.db, "old-finished"))

	st, err = b.newSweeper(t, &workflow.SweeperConfig{Retention: 10 * time.Minute, PartitionRemoval: here}).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Partitions.Removed, "inside the window (%s): removed", here)
	require.NotContains(t, attached(), old)
	require.Zero(t, keyRows(t, b.db, "old-finished"))
}
