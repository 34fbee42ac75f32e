package workflow_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// storedHistory is a key's history column as stored, as text.
func storedHistory(t *testing.T, b *bundle, scope, key string) string {
	t.Helper()
	var h string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT history::text FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).Scan(&h))
	return h
}

// requireDerivedFinish checks that info's history is its earlier entries (how many:
// before) and then the finish derived from the key row.
func requireDerivedFinish(t *testing.T, info *workflow.KeyInfo, before int) {
	t.Helper()
	require.Len(t, info.History, before+1)
	last := info.History[before]
	require.NotNil(t, info.FinishedAt)
	require.True(t, last.Derived)
	require.Equal(t, info.Attempts, last.Attempt)
	require.Equal(t, workflow.OutcomeFinished, last.Outcome)
	require.True(t, last.At.Equal(*info.FinishedAt), "at is the row's finished_at")
	require.Empty(t, last.By)
	require.Empty(t, last.From)
	require.Empty(t, last.Phases)
	if before == 0 {
		require.Equal(t, info.FinishedAt.Sub(info.CreatedAt).Milliseconds(), last.Millis, "from the claim to the finish")
	} else {
		require.Zero(t, last.Millis, "it did not run from the claim")
	}
}

// With Config.HistoryOmitCleanFinish, a key's first attempt that finishes from the
// start stores no history entry (its row's history stays empty) and the key's history
// shows one derived from the row; every other attempt stores its entry as before,
// including the one after a first attempt whose backend was terminated at its finish.
func TestHistoryOmitCleanFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	var kill atomic.Bool
	lean := b.newEngine(t, setupOpts{cfg: &workflow.Config{HistoryOmitCleanFinish: true},
		before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() != testflow.Settle || run.Key() != "killed" || !kill.CompareAndSwap(false, true) {
				return nil
			}
			return terminateOwnBackend(ctx, tx, b.db.Pool) // the finish's own backend
		}})

	t.Run("CleanFinishStoresNone", func(t *testing.T) {
		res, err := lean.Do(ctx, chargeReq("acct", "clean", `{"amount":5}`))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
		require.Equal(t, "[]", storedHistory(t, b, "acct", "clean"))
		requireOneEffect(t, b, "acct", "clean")

		info, err := lean.InspectKey(ctx, "acct", "clean")
		require.NoError(t, err)
		require.Equal(t, 1, info.Attempts)
		requireDerivedFinish(t, info, 0)

		replay, err := lean.Do(ctx, chargeReq("acct", "clean", `{"amount":5}`))
		require.NoError(t, err)
		require.True(t, replay.Replayed)
		require.Equal(t, res.Response.Body, replay.Response.Body)
		require.Equal(t, "[]", storedHistory(t, b, "acct", "clean"), "a replay writes nothing")

		// An engine without the setting reads the same key the same way.
		info, err = b.engine.InspectKey(ctx, "acct", "clean")
		require.NoError(t, err)
		requireDerivedFinish(t, info, 0)
	})

	t.Run("DefaultStoresTheEntry", func(t *testing.T) {
		_, err := b.engine.Do(ctx, chargeReq("acct", "default", `{"amount":5}`))
		require.NoError(t, err)
		info, err := b.engine.InspectKey(ctx, "acct", "default")
		require.NoError(t, err)
		require.Len(t, info.History, 1)
		require.False(t, info.History[0].Derived)
		require.Equal(t, workflow.ExecutorClient, info.History[0].By)
		require.Equal(t, []string{testflow.Reserve, testflow.Pay, testflow.Settle}, info.History[0].Phases)
	})

	t.Run("FinishKilledThenResumed", func(t *testing.T) {
		_, err := lean.Do(ctx, chargeReq("acct", "killed", `{"amount":3}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
		require.True(t, kill.Load())
		st := state(t, b.db, "acct", "killed")
		require.Equal(t, testflow.Pay, st.RecoveryPoint, "released with the call's result")

		res, err := lean.Do(ctx, chargeReq("acct", "killed", `{"amount":3}`))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
		requireOneEffect(t, b, "acct", "killed")

		info, err := lean.InspectKey(ctx, "acct", "killed")
		require.NoError(t, err)
		require.Len(t, info.History, 2, "both attempts stored their entries")
		require.Equal(t, workflow.OutcomeReleased, info.History[0].Outcome)
		require.Equal(t, 1, info.History[0].Attempt)
		second := info.History[1]
		require.False(t, second.Derived)
		require.Equal(t, workflow.Attempt{Attempt: 2, By: workflow.ExecutorClient, From: testflow.Pay,
			Phases: []string{testflow.Settle}, Outcome: workflow.OutcomeFinished},
			workflow.Attempt{Attempt: second.Attempt, By: second.By, From: second.From, Phases: second.Phases, Outcome: second.Outcome})
	})

	t.Run("SweptAttemptStoresItsEntry", func(t *testing.T) {
		b.provider.FailNext(1)
		_, err := lean.Do(ctx, chargeReq("acct", "swept", `{"amount":4}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
		sweepable(t, b.db)
		require.Contains(t, sweepOnce(t, lean, 0), workflow.OutcomeFinished)
		info, err := lean.InspectKey(ctx, "acct", "swept")
		require.NoError(t, err)
		require.Len(t, info.History, 2)
		require.Equal(t, workflow.ExecutorSweeper, info.History[1].By)
		require.Equal(t, workflow.OutcomeFinished, info.History[1].Outcome)
		require.False(t, info.History[1].Derived)
	})

	t.Run("HistoryOffShowsNone", func(t *testing.T) {
		off := b.newEngine(t, setupOpts{cfg: &workflow.Config{History: -1, HistoryOmitCleanFinish: true}})
		info, err := off.InspectKey(ctx, "acct", "clean")
		require.NoError(t, err)
		require.Empty(t, info.History, "an engine that keeps no history derives none")
	})
}

// A pipelined flow whose first transaction answers (the claim, the insert and the
// finished key row in one round trip) stores no entry either.
func TestHistoryOmitCleanFinishPipelined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := testflow.Start(t)
	e, err := workflow.New(db.Pool, &workflow.Config{HistoryOmitCleanFinish: true})
	require.NoError(t, err)
	require.NoError(t, e.Register(phases.Flow{Name: "one_shot", Phases: []phases.Phase{
		phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(`SELECT $1::text`, run.Key())
			return phases.JSON(http.StatusCreated, map[string]string{"key": run.Key()})
		}),
	}}))
	res, err := e.Do(ctx, workflow.Request{Scope: "acct", Key: "one", Flow: "one_shot", Method: "POST", Route: "/one", Body: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)
	var h string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT history::text FROM idemflow_keys WHERE idempotency_key = 'one'`).Scan(&h))
	require.Equal(t, "[]", h)
	info, err := e.InspectKey(ctx, "acct", "one")
	require.NoError(t, err)
	requireDerivedFinish(t, info, 0)
}
