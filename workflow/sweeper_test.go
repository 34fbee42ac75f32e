package workflow_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// The tests of the engine's sweeper that need its test hooks (sweep_export_test.go);
// the rest of its tests are in package sweeper.

// stuckAtReserve runs the flow for each key with its pay phase failing, leaving the
// key released at reserve, and makes the keys due.
func stuckAtReserve(t *testing.T, b *bundle, failPay *atomic.Bool, keys ...string) {
	t.Helper()
	failPay.Store(true)
	defer failPay.Store(false)
	for _, k := range keys {
		_, err := b.engine.Do(context.Background(), chargeReq("acct", k, `{"amount":250}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
	}
	testflow.Sweepable(t, b.db.Pool)
}

// sweptState is what Stop leaves of a key given back: whether it is leased and due.
func sweptState(t *testing.T, b *bundle, key string) (leased, due bool) {
	t.Helper()
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
		SELECT locked_until IS NOT NULL, next_attempt_at <= statement_timestamp()
		FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&leased, &due))
	return leased, due
}

// TestStopFinishesInFlightGivesBackTheRest: Stop lets the key being run finish and
// gives back, at once, the keys taken but not started. Stop is called once the pass
// took all three keys (its second chunk is taken while the first key runs; stopped
// before, the pass would take no more, as on Citus's slower takeover it did).
func TestStopFinishesInFlightGivesBackTheRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	entered := make(chan string, 1)
	unblock := make(chan struct{})
	allTaken := make(chan struct{})
	var armed, blocked, failPay atomic.Bool
	var givenBack, swept atomic.Int64
	b := setup(t, setupOpts{cfg: &workflow.Config{Hooks: workflow.Hooks{
		Key: func(_ context.Context, e workflow.KeyEvent) {
			if e.Kind == workflow.OutcomeGivenBack {
				givenBack.Add(1)
			}
			if e.Kind == workflow.OutcomeSwept && armed.Load() && swept.Add(1) == 3 {
				close(allTaken)
			}
		},
		PhaseStart: func(ctx context.Context, e workflow.PhaseEvent) context.Context {
			if armed.Load() && e.Phase == testflow.Pay && blocked.CompareAndSwap(false, true) {
				entered <- e.Key
				<-unblock
			}
			return ctx
		},
	}}, before: func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
		if failPay.Load() && run.Phase() == testflow.Pay {
			return testflow.ErrInjected
		}
		return nil
	}})
	keys := []string{"a", "b", "c"}
	stuckAtReserve(t, b, &failPay, keys...)
	armed.Store(true)
	before := map[string]keyState{}
	for _, k := range keys {
		before[k] = state(t, b.db, "acct", k)
	}

	var pass atomic.Pointer[workflow.SweepStats]
	stopping := make(chan struct{})
	workflow.SetStoppingHook(b.engine, func() { close(stopping) })
	require.NoError(t, b.engine.Start(ctx, &workflow.SweeperConfig{BatchSize: 3, Concurrency: 1, Hooks: workflow.SweeperHooks{
		Pass: func(_ context.Context, st workflow.SweepStats, err error) {
			if st.Taken > 0 {
				pass.Store(&st)
			}
		},
	}}))
	running := <-entered
	select {
	case <-allTaken:
	case <-time.After(time.Minute):
		t.Fatalf("the pass took %d of the 3 keys within a minute", swept.Load())
	}
	stopped := make(chan error, 1)
	go func() { stopped <- b.engine.Stop(ctx) }()
	<-stopping
	close(unblock)
	require.NoError(t, <-stopped)

	require.Equal(t, &workflow.SweepStats{Taken: 3, Finished: 1, GivenBack: 2}, pass.Load())
	require.EqualValues(t, 2, givenBack.Load())
	requireOneEffect(t, b, "acct", running)
	for _, k := range keys {
		if k == running {
			continue
		}
		st := state(t, b.db, "acct", k)
		leased, due := sweptState(t, b, k)
		require.Equal(t, "in_progress", st.Status, k)
		require.False(t, leased, "%s: released at once", k)
		require.True(t, due, "%s: still due", k)
		require.Equal(t, before[k].Attempts, st.Attempts, "%s: the unrun attempt is not counted", k)
		require.Equal(t, before[k].LockVersion+1, st.LockVersion, k)
	}

	stats, err := b.engine.Sweep(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, workflow.SweepStats{Taken: 2, Finished: 2}, stats)
	for _, k := range keys {
		requireOneEffect(t, b, "acct", k)
	}
	require.Equal(t, 3, b.provider.Made())
}

// TestCleanupRestsBetweenFullBatches: a backlog is deleted in batches with a rest after
// each full one (none after the last, short one), unless CleanupShare is 1.
func TestCleanupRestsBetweenFullBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	backlog := func() {
		for i := range 5 {
			res, err := b.engine.Do(ctx, chargeReq("acct", fmt.Sprintf("old-%d", i), `{"amount":250}`))
			require.NoError(t, err)
			require.False(t, res.Replayed)
			require.Equal(t, 201, res.Response.Status)
		}
		_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET finished_at = statement_timestamp() - interval '2 days'`)
		require.NoError(t, err)
	}
	backlog()

	var mu sync.Mutex
	var rests []time.Duration
	workflow.SetRestHook(b.engine, func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		rests = append(rests, d)
	})
	for _, tc := range []struct {
		share float64
		rests int
	}{{0, 2}, {0.25, 2}, {1, 0}} {
		rests = nil
		stats, err := b.engine.Sweep(ctx, &workflow.SweeperConfig{CleanupBatch: 2, CleanupShare: tc.share})
		require.NoError(t, err)
		require.EqualValues(t, 5, stats.Expired, "share %g", tc.share)
		require.Len(t, rests, tc.rests, "share %g: a rest after each full batch of 2, none after the last of 1", tc.share)
		backlog() // put the backlog back for the next case
	}
}
