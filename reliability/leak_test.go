package reliability

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestStartStopLeaks builds an engine and a sweeper and starts and stops the sweeper
// hundreds of times (Stop, ending Start's context, Stop during a pass), running keys in
// between and opening a new pool now and then, and checks that no goroutine is left
// behind. It is not parallel: while it runs, every parallel test is paused, so the
// goroutines it did not start are the ones it found.
func TestStartStopLeaks(t *testing.T) {
	env := newEnv(t, pgtest.New(t)) // its server, pools and provider live on after the check
	before := goleak.IgnoreCurrent()
	rounds := tier(200, 1000)
	ctx := context.Background()
	pool := env.db.NewPool(t)
	for i := range rounds {
		if i%50 == 49 {
			pool.Close()
			pool = env.db.NewPool(t)
		}
		en, err := workflow.New(pool, nil)
		require.NoError(t, err)
		require.NoError(t, registerFlows(en, env.provider.URL, env.client, nil, nil, flowShape{}))
		swCfg := &workflow.SweeperConfig{Interval: time.Millisecond, Grace: -1}
		switch i % 4 {
		case 0: // start, stop
			require.NoError(t, en.Start(ctx, swCfg))
			require.NoError(t, en.Stop(ctx))
		case 1: // start, end its context, start again, stop
			sctx, cancel := context.WithCancel(ctx)
			require.NoError(t, en.Start(sctx, swCfg))
			cancel()
			require.NoError(t, en.Start(ctx, swCfg))
			require.NoError(t, en.Stop(ctx))
		case 2: // a key to sweep, stop while the pass may run
			req := request("acct", fmt.Sprintf("leak-%d", i), []string{"create_charge", twoCallFlow}[i%2], int64(1+i))
			env.provider.FailNext(1)
			_, err := en.Do(ctx, req)
			require.ErrorIs(t, err, workflow.ErrTransient)
			env.expireLease(t, "acct", req.Key)
			require.NoError(t, en.Start(ctx, swCfg))
			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			require.NoError(t, en.Stop(stopCtx))
			cancel()
			_, err = en.Sweep(ctx, swCfg) // whatever the pass left
			require.NoError(t, err)
		case 3: // a request, a replay, RunOnce
			req := request("acct", fmt.Sprintf("leak-%d", i), chargeflowName, int64(1+i))
			_, err := en.Do(ctx, req)
			require.NoError(t, err)
			res, err := en.Do(ctx, req)
			require.NoError(t, err)
			require.True(t, res.Replayed)
			_, err = en.Sweep(ctx, swCfg)
			require.NoError(t, err)
		}
	}
	pool.Close()
	env.client.CloseIdleConnections()
	require.NoError(t, goleak.Find(before), "goroutines left after %d start/stop rounds", rounds)
	t.Logf("leaks: start_stop_rounds=%d leaked_goroutines=0", rounds)
}

const chargeflowName = "create_charge"
