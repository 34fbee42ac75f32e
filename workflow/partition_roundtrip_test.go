package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// TestRoundTripsPartitioned is TestRoundTrips on a day-partitioned key table
// (docs/PARTITIONS.md, "The look-up before a claim"): a fresh key costs what it costs
// on the plain layout (the look-up before the claim reads the current partition alone,
// in one round trip), and a replay of a recent key one round trip.
func TestRoundTripsPartitioned(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: the Store does not address partitions by name there, so the look-up before a claim is not the current partition's alone (docs/PARTITIONS.md)")
	}
	ctx := context.Background()
	b := setup(t, setupOpts{})
	require.NoError(t, store.New().SetupPartitioned(ctx, b.db.Pool, store.PartitionDay, 0))
	e, rt := countedEngine(t, b)

	rt.n.Store(0)
	res, err := e.Do(ctx, chargeReq("acct", "fresh", `{"amount":1}`))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, int64(7), rt.n.Load(), "the current partition's look-up, BEGIN+claim, INSERT, key INSERT+COMMIT, BEGIN+UPDATE, INSERT, finish+COMMIT")

	// The claim folded into the first statement's round trip: one round trip less.
	ef, rtf := countedEngineWith(t, b, &workflow.Config{ClaimWithFirstStatement: true})
	rtf.n.Store(0)
	res, err = ef.Do(ctx, chargeReq("acct", "fresh-folded", `{"amount":1}`))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, int64(6), rtf.n.Load(), "the current partition's look-up, BEGIN+claim+INSERT, key INSERT+COMMIT, BEGIN+UPDATE, INSERT, finish+COMMIT")

	rt.n.Store(0)
	res, err = e.Do(ctx, chargeReq("acct", "fresh", `{"amount":1}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, int64(1), rt.n.Load(), "round trips for a replay")
}
