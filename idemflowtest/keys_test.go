package idemflowtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/workflow"
)

// TestKeyStates: a key through in progress, dead-lettered and (another) finished, as
// the assertions and ExpireLease see it, with no sleep anywhere.
func TestKeyStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemflowtest.NewDB(t, ledgerSchema)
	remote := idemflowtest.NewRemote(t, nil)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(ledgerFlow(db, remote, flowOpts{})))
	req := func(key string) workflow.Request {
		return workflow.Request{Scope: "acct", Key: key, Flow: "ledger", Method: "POST", Route: "/", Body: []byte(`{}`)}
	}

	_, ok := idemflowtest.LookupKey(t, db.Pool, "acct", "dead")
	require.False(t, ok)
	remote.FailNext(2)
	_, err = e.Do(ctx, req("dead"))
	require.ErrorIs(t, err, workflow.ErrTransient)
	k := idemflowtest.RequireInProgressAt(t, db.Pool, "acct", "dead", "debit")
	require.False(t, k.Leased, "a transient failure released the key")
	require.Contains(t, k.LastError, "503")

	swCfg := &workflow.SweeperConfig{MaxAttempts: 2}
	st, err := e.Sweep(ctx, swCfg)
	require.NoError(t, err)
	require.Zero(t, st.Taken, "the backoff and the grace period have not run out")
	require.True(t, idemflowtest.ExpireLease(t, db.Pool, "acct", "dead"))
	st, err = e.Sweep(ctx, swCfg)
	require.NoError(t, err)
	require.Equal(t, 1, st.DeadLettered, "%+v", st)
	require.Zero(t, remote.Armed(), "both failures fired")
	k = idemflowtest.RequireDeadLettered(t, db.Pool, "acct", "dead")
	require.Equal(t, 2, k.Attempts)
	require.False(t, idemflowtest.ExpireLease(t, db.Pool, "acct", "dead"), "nothing to expire on a dead key")

	res, err := e.Do(ctx, req("ok"))
	require.NoError(t, err)
	k = idemflowtest.RequireFinished(t, db.Pool, "acct", "ok")
	require.Equal(t, phases.Finished, k.RecoveryPoint)
	require.Equal(t, res.Response.Status, k.ResponseStatus)
	require.Equal(t, res.Response.Body, k.ResponseBody)
	require.Zero(t, idemflowtest.ExpireAll(t, db.Pool), "no unfinished key is left")
}

// TestExpireLeasePartitioned: on a key table partitioned by the minute, with no
// partition behind the current one, ExpireLease moves a key's creation time only as far
// back as its partition allows (an hour back would leave it), and a retry then takes
// the key over and finishes it.
func TestExpireLeasePartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemflowtest.NewDB(t, ledgerSchema)
	require.NoError(t, store.New().SetupPartitioned(ctx, db.Pool, time.Minute, 0))
	remote := idemflowtest.NewRemote(t, nil)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(ledgerFlow(db, remote, flowOpts{})))
	req := workflow.Request{Scope: "acct", Key: "edge", Flow: "ledger", Method: "POST", Route: "/", Body: []byte(`{}`)}
	remote.FailNext(1)
	_, err = e.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)

	where := func() (part string, created time.Time) {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text, created_at FROM idemflow_keys
			WHERE scope = 'acct' AND idempotency_key = 'edge'`).Scan(&part, &created))
		return part, created
	}
	part, created := where()
	require.True(t, idemflowtest.ExpireLease(t, db.Pool, "acct", "edge"))
	movedPart, moved := where()
	require.Equal(t, part, movedPart, "the row stays in its partition")
	require.False(t, moved.After(created))
	require.Equal(t, created.UTC().Truncate(time.Minute), moved.UTC().Truncate(time.Minute), "moved back within its minute-wide partition")

	_, err = e.Do(ctx, req)
	require.NoError(t, err, "a retry takes the expired key over")
	idemflowtest.RequireFinished(t, db.Pool, "acct", "edge")
}
