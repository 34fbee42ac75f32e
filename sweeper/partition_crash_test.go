package sweeper_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestPartitionedCrashMatrix is the crash matrix (a child process killed with SIGKILL
// at every boundary of the charge flow, recovered by a retry, a sweeper, and a sweeper
// after a killed sweeper) on a key table partitioned by the day: one effect per key,
// one provider payment per key, and one row per (scope, key).
func TestPartitionedCrashMatrix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemflowtest.NewDB(t, testflow.Schema)
	// In the parent this partitions the fresh, empty key table; in each child, which
	// runs this again on the parent's database, it finds it partitioned and leaves it
	// (the week ahead exists).
	require.NoError(t, store.New().SetupPartitioned(ctx, db.Pool, store.PartitionDay, 0))
	provider := idemflowtest.NewRemote(t, nil)
	cases := 0
	idemflowtest.CrashMatrix(t, idemflowtest.Crash{
		DB:      db,
		Flow:    testflow.Flow(testflow.Options{ProviderURL: provider.URL}),
		Request: workflow.Request{Scope: "acct", Key: "crash", Method: "POST", Route: "/charges", Body: []byte(`{"amount":250}`)},
		Check: func(t testing.TB, c *idemflowtest.Case) {
			cases++
			e, err := testflow.CountEffects(ctx, c.DB.Pool, c.Request.Scope, c.Request.Key)
			require.NoError(t, err)
			require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, e)
			require.Equal(t, 201, c.Answer.Status)
			var rows int
			require.NoError(t, c.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`,
				c.Request.Scope, c.Request.Key).Scan(&rows))
			require.Equal(t, 1, rows, "one row for the key")
		},
	})
	require.Equal(t, len(idemflowtest.Boundaries(testflow.Flow(testflow.Options{})))*3, cases)
	require.Equal(t, cases, provider.Made(), "one provider payment per key")
	var kind string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'idemflow_keys'::regclass`).Scan(&kind))
	require.Equal(t, "p", kind, "the matrix ran on the partitioned table")
}
