package sweeper_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// envFlow names the flow a "partition-claim" child runs: charge3 or payfirst.
const envFlow = "IDEMFLOW_SWEEP_FLOW"

func init() { childproc.Register("partition-claim", runClaimChild) }

// runClaimChild runs one request of the flow envFlow on the key envKey and SIGKILLs
// itself at the crash point envPoint.
func runClaimChild() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envDBURL))
	if err != nil {
		childproc.Fail("connect", err)
	}
	hooks := childproc.NewPoints(os.Getenv(envPoint), 0, func(string) { childproc.Kill() }).Hooks(workflow.Hooks{})
	e, err := workflow.New(pool, &workflow.Config{Hooks: hooks})
	if err != nil {
		childproc.Fail("engine", err)
	}
	if err := registerFlows(e, os.Getenv(envProvider), nil); err != nil {
		childproc.Fail("register", err)
	}
	req := chargeReq(os.Getenv(envKey))
	if os.Getenv(envFlow) == payFirst {
		req = payFirstReq(os.Getenv(envKey))
	}
	_, err = e.Do(ctx, req)
	childproc.Fail("the crash point never fired; Do returned", err)
}

// TestPartitionedClaimAfterCrashAcrossBoundary: a process claims a key and is killed
// (SIGKILL) at a boundary after its row became durable; the row sits in the previous
// minute's partition, as for a key claimed just before a boundary, and its lease has
// run out. Retries after the boundary, racing, look in the current partition alone
// before their claims (Store.LookupRecent), miss the row, and must find it under the
// claim lock: one row, one ledger row and one provider payment per key, for a first tx
// phase (the claim's look-up) and a first call phase (the claim that inserts with its
// check), killed before and after the payment.
func TestPartitionedClaimAfterCrashAcrossBoundary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPartitioned(t)
	for _, c := range []struct{ flow, point string }{
		{testflow.Name, childproc.Claimed},
		{testflow.Name, testflow.Pay + "/" + childproc.AfterCall},
		{payFirst, childproc.Claimed},
		{payFirst, payFirstCharge + "/" + childproc.AfterCall},
	} {
		key := fmt.Sprintf("%s-%s", c.flow, c.point)
		t.Run(key, func(t *testing.T) {
			before := b.provider.Made()
			child := childproc.Start(t, "^$", childproc.Program("partition-claim"), envDBURL+"="+b.db.URL,
				envProvider+"="+b.provider.URL, envFlow+"="+c.flow, envKey+"="+key, envPoint+"="+c.point)
			_, err := child.Exit()
			require.Error(t, err, "the child was killed at %s; stderr:\n%s", c.point, child.Stderr())
			require.Equal(t, 1, keyRows(t, b.db, key), "the killed attempt's row is durable")
			moveBack(t, b.db, key)
			_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET locked_until = statement_timestamp()
WHERE scope = 'acct' AND idempotency_key = $1`, key) // the dead child's lease ran out
			require.NoError(t, err)

			req := chargeReq(key)
			if c.flow == payFirst {
				req = payFirstReq(key)
			}
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() { _, _ = b.engine.Do(ctx, req) }) // racing retries; the table decides
			}
			wg.Wait()
			res, err := b.engine.Do(ctx, req)
			require.NoError(t, err)
			require.Equal(t, 201, res.Response.Status)
			require.Equal(t, 1, keyRows(t, b.db, key), "one row for the key")
			e, err := testflow.CountEffects(ctx, b.db.Pool, "acct", key)
			require.NoError(t, err)
			require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, e)
			require.Equal(t, before+1, b.provider.Made(), "one provider payment for the key")
		})
	}
}
