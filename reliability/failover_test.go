package reliability

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/faultproxy"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestFailoverLostCommit runs a primary and a streaming standby (local binaries, the
// standby streaming through a fault proxy), cuts replication at the worst moment (just
// before the commit that precedes the call phase, so that the primary has the commit
// and the standby never gets it), fails over (the primary crashes, the standby is
// promoted) and sends the retry to the promoted standby. It counts the provider's
// payments: with Config.StandbyWait the call never started, so the retry makes the only
// payment; without it (asynchronous replication as it is) the retry, finding no key
// row, makes a new one with a new derived key and the provider charges twice. The
// second subtest shows that hazard, so that the first one is known to be able to fail.
func TestFailoverLostCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		wait     time.Duration
		payments int
	}{
		{"StandbyWait", 5 * time.Second, 1},
		{"NoWaitChargesTwice", 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			failover(t, tc.wait, tc.payments)
		})
	}
}

func failover(t *testing.T, wait time.Duration, payments int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary, err := pgtest.StartDedicated(ctx)
	if errors.Is(err, pgtest.ErrNoServer) {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = primary.Stop() })
	proxy, err := faultproxy.New(primary.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	standby, err := pgtest.StartStandby(ctx, primary, proxy.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop() })

	ppool, err := pgxpool.New(ctx, primary.URL)
	require.NoError(t, err)
	t.Cleanup(ppool.Close)
	require.NoError(t, migrations.Migrate(ctx, ppool))
	require.NoError(t, testflow.CreateTables(ctx, ppool))
	remote := idemflowtest.NewRemote(t, nil)
	waitCaughtUp(ctx, t, ppool)
	if wait > 0 {
		measureStandbyWait(ctx, t, ppool, remote)
	}

	cut := false
	e := testflow.Engine(t, ppool, &workflow.Config{StandbyWait: wait}, remote, func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
		if run.Key() == "lost" && run.Phase() == testflow.Reserve && !cut {
			cut = true
			_ = proxy.Close() // replication is cut before the commit that precedes the call
		}
		return nil
	})
	before := remote.Made()
	res, err := e.Do(ctx, chargeReq("lost"))
	if wait > 0 {
		require.ErrorIs(t, err, workflow.ErrStandbyBehind, "the call started before a standby had its commit")
	} else {
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
	}

	require.NoError(t, primary.Crash())
	spool, err := pgxpool.New(ctx, standby.URL)
	require.NoError(t, err)
	t.Cleanup(spool.Close)
	_, err = spool.Exec(ctx, `SELECT pg_promote(true, 60)`)
	require.NoError(t, err)
	e2 := testflow.Engine(t, spool, nil, remote, nil)
	res, err = e2.Do(ctx, chargeReq("lost"))
	require.NoError(t, err, "the retry on the promoted standby")
	require.Equal(t, http.StatusCreated, res.Response.Status)
	require.Equal(t, payments, remote.Made()-before, "provider payments for the key")
}

func chargeReq(key string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: testflow.Name, Method: http.MethodPost, Route: "/charges", Body: []byte(`{"amount":5}`)}
}

// waitCaughtUp waits, by the primary's own view, until a standby streams and has
// flushed everything written so far.
func waitCaughtUp(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(flush_lsn >= pg_current_wal_lsn()), false)
			FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&ok)
		require.NoError(t, err, "the standby did not catch up")
		if ok {
			return
		}
	}
}

// measureStandbyWait logs the median time of a new key with and without the standby
// wait, replication intact: what the wait costs (logged, not asserted). Every key must
// pass the wait, so its bound is long: the 5 s of the lost commit's engine could pass
// before a stalled standby confirmed one of the 40 keys.
func measureStandbyWait(ctx context.Context, t *testing.T, pool *pgxpool.Pool, remote *idemflowtest.Remote) {
	t.Helper()
	const n = 40
	median := func(name string, cfg *workflow.Config) time.Duration {
		e := testflow.Engine(t, pool, cfg, remote, nil)
		took := make([]time.Duration, 0, n)
		for i := range n {
			start := time.Now()
			_, err := e.Do(ctx, chargeReq(name+"-"+string(rune('a'+i%26))+string(rune('a'+i/26))))
			require.NoError(t, err)
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		return took[n/2]
	}
	without := median("nowait", nil)
	with := median("wait", &workflow.Config{StandbyWait: time.Minute})
	t.Logf("standby wait: median new key %s without, %s with (+%s), %d keys each",
		without.Round(10*time.Microsecond), with.Round(10*time.Microsecond), (with - without).Round(10*time.Microsecond), n)
}
