package workflow_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/faultproxy"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestCrashMatrix kills a real child process (SIGKILL) at every boundary of the flow
// (idemflowtest.Boundaries: after the claim, around each commit and call, after the
// response is stored) and recovers each key by a retry, a sweeper, and a sweeper after
// a killed sweeper: one effect, one provider payment, and the answer names it.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	db := idemflowtest.NewDB(t, testflow.Schema)
	provider := idemflowtest.NewRemote(t, nil)
	cases := 0
	idemflowtest.CrashMatrix(t, idemflowtest.Crash{
		DB:      db,
		Flow:    testflow.Flow(testflow.Options{ProviderURL: provider.URL}),
		Request: chargeReq("acct", "crash", `{"amount":250}`),
		Check: func(t testing.TB, c *idemflowtest.Case) {
			cases++
			if c.Boundary.Phase == testflow.Reserve && c.Boundary.At != idemflowtest.AfterCommit {
				// The key row is inserted at the first phase's commit: nothing was left,
				// and the claim lock died with the child's connection.
				require.Nil(t, c.Left, "a key row before the first commit")
			}
			e, err := testflow.CountEffects(context.Background(), c.DB.Pool, c.Request.Scope, c.Request.Key)
			require.NoError(t, err)
			require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, e)
			require.Equal(t, 201, c.Answer.Status)
			var ans testflow.Answer
			require.NoError(t, json.Unmarshal(c.Answer.Body, &ans))
			paid, ok := provider.Effect(c.DerivedKey(testflow.Pay))
			require.True(t, ok)
			require.Equal(t, paid.ID, ans.PaymentID, "the answer names the one provider payment")
		},
	})
	require.Equal(t, len(idemflowtest.Boundaries(testflow.Flow(testflow.Options{})))*3, cases)
	require.Equal(t, cases, provider.Made(), "one provider payment per key")
}

// proxiedPool opens a pool on the schema whose connections go through a fault proxy,
// in pgx's default query exec mode.
func proxiedPool(t *testing.T, b *bundle) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	return proxiedModePool(t, b, pgx.QueryExecModeCacheStatement)
}

func TestCommitAcknowledgementLost(t *testing.T) {
	t.Parallel()
	for _, phase := range []string{testflow.Reserve, testflow.Settle} {
		t.Run(phase, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			pool, proxy := proxiedPool(t, b)
			requireLostAckResolved(t, b, pool, proxy, phase)
		})
	}
}

func TestDatabaseGoneMidPhase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	var killed atomic.Bool
	e := b.newEngine(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Settle && killed.CompareAndSwap(false, true) {
			return terminateOwnBackend(ctx, tx, b.db.Pool)
		}
		return nil
	}})
	_, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.True(t, killed.Load())
	st := state(t, b.db, "acct", "k")
	require.Equal(t, testflow.Pay, st.RecoveryPoint, "released with the call's result")
	require.False(t, st.HasLease)

	res, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k")
	require.Equal(t, 1, b.provider.Made())
}

// requireLostAckResolved: the answer to phase's commit is dropped once (through
// proxy, which pool goes through) after the server committed; the engine re-reads
// the key, learns the commit happened and goes on: the phase ran once, the first
// attempt answers 201 with one effect, and a replay answers the same.
func requireLostAckResolved(t *testing.T, b *bundle, pool *pgxpool.Pool, proxy *faultproxy.Proxy, phase string) {
	t.Helper()
	ctx := context.Background()
	var armed atomic.Bool
	var runs atomic.Int32
	e := b.newEngine(t, setupOpts{pool: pool, cfg: &workflow.Config{Hooks: workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Phase == phase {
				runs.Add(1)
			}
			return ctx
		},
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) {
			if ev.Phase == phase && armed.CompareAndSwap(false, true) {
				proxy.DropNextCommitAck()
			}
		},
	}}})
	res, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.NoError(t, err, "the engine re-reads the key and learns the commit happened")
	require.EqualValues(t, 1, proxy.Dropped(), "the fault fired")
	require.EqualValues(t, 1, runs.Load(), "the phase was not redone")
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k")

	replay, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, res.Response.Body, replay.Response.Body)
}
