package workflow_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// sweepable moves every key's claim, backoff and lease into the past.
func sweepable(t *testing.T, db *pgtest.DB) { testflow.Sweepable(t, db.Pool) }

func TestTakeDueAndRunTaken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var swept []workflow.KeyEvent
	b := setup(t, setupOpts{cfg: &workflow.Config{Hooks: workflow.Hooks{Key: func(_ context.Context, ev workflow.KeyEvent) {
		if ev.Kind == workflow.OutcomeSwept {
			swept = append(swept, ev)
		}
	}}}})

	_, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{})
	require.Error(t, err, "a limit is required")
	taken, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, taken)
	_, err = b.engine.Maintenance().Run(ctx, &workflow.Taken{}, nil)
	require.Error(t, err, "only keys from TakeDue")
	require.Error(t, b.engine.Maintenance().GiveBack(ctx, &workflow.Taken{}))

	b.provider.FailNext(1)
	_, err = b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	before := state(t, b.db, "acct", "k")

	taken, err = b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10, Grace: time.Hour})
	require.NoError(t, err)
	require.Empty(t, taken, "inside the backoff")
	sweepable(t, b.db)
	taken, err = b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10, Grace: time.Minute})
	require.NoError(t, err)
	require.Len(t, taken, 1)
	tk := taken[0]
	require.Equal(t, "acct", tk.Scope)
	require.Equal(t, "k", tk.Key)
	require.Equal(t, testflow.Name, tk.Flow)
	require.Equal(t, testflow.Reserve, tk.RecoveryPoint)
	require.Equal(t, before.LockVersion+1, tk.LockVersion)
	require.Equal(t, before.Attempts+1, tk.Attempts)
	require.Greater(t, tk.LeaseLeft(), 20*time.Second)
	require.Len(t, swept, 1)
	require.True(t, state(t, b.db, "acct", "k").HasLease)

	again, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, again, "a taken key is leased")

	// Given back: released, the attempt uncounted, still due.
	require.NoError(t, b.engine.Maintenance().GiveBack(ctx, tk))
	st := state(t, b.db, "acct", "k")
	require.False(t, st.HasLease)
	require.Equal(t, before.Attempts, st.Attempts)
	require.Equal(t, tk.LockVersion, st.LockVersion)
	require.NoError(t, b.engine.Maintenance().GiveBack(ctx, tk), "a second give-back finds the key released and is a no-op")
	require.Equal(t, st, state(t, b.db, "acct", "k"))

	taken, err = b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10})
	require.NoError(t, err)
	require.Len(t, taken, 1)
	res, err := b.engine.Maintenance().Run(ctx, taken[0], nil)
	require.NoError(t, err)
	require.Equal(t, workflow.OutcomeFinished, res.Outcome)
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k")

	// A taken key that another executor took over in the meantime is fenced off.
	require.NoError(t, b.engine.Maintenance().GiveBack(ctx, taken[0]), "finished: nothing to give back")
}

func TestRunTakenLeaseLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	b.provider.FailNext(1)
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	sweepable(t, b.db)
	taken, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 1})
	require.NoError(t, err)
	require.Len(t, taken, 1)

	// Its lease ends and a client's retry takes the key over and finishes it first.
	sweepable(t, b.db)
	res, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	finished := keyRow(t, b.db, "acct", "k")

	out, err := b.engine.Maintenance().Run(ctx, taken[0], &workflow.RunOpts{MaxAttempts: 1})
	require.NoError(t, err)
	require.Equal(t, workflow.OutcomeLeaseLost, out.Outcome)
	require.ErrorIs(t, out.Err, workflow.ErrLeaseLost)
	require.Equal(t, finished, keyRow(t, b.db, "acct", "k"))
	requireOneEffect(t, b, "acct", "k")
	require.Equal(t, 1, b.provider.Made())
}

// A response too large to store is a failed attempt for a sweep like for a client:
// released with a backoff and its cause, then dead-lettered when attempts run out.
func TestRunTakenResponseTooLarge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	e, err := workflow.New(b.db.Pool, &workflow.Config{MaxResponseBytes: 8})
	require.NoError(t, err)
	require.NoError(t, e.Register(phases.Flow{Name: "big", Phases: []phases.Phase{
		phases.Tx("start", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
		phases.Call("answer", func(context.Context, *phases.Run) (*phases.Response, error) {
			return &phases.Response{Status: http.StatusOK, Body: []byte(strings.Repeat("x", 64))}, nil
		}),
	}}))
	req := workflow.Request{Scope: "acct", Key: "big", Flow: "big", Method: "POST", Route: "/big", Body: []byte(`{}`)}
	_, err = e.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrResponseTooLarge)

	sweepable(t, b.db)
	taken, err := e.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 1})
	require.NoError(t, err)
	require.Len(t, taken, 1)
	out, err := e.Maintenance().Run(ctx, taken[0], &workflow.RunOpts{MaxAttempts: 3})
	require.NoError(t, err)
	require.Equal(t, workflow.OutcomeReleased, out.Outcome)
	require.ErrorIs(t, out.Err, workflow.ErrResponseTooLarge)
	st := state(t, b.db, "acct", "big")
	require.False(t, st.HasLease)
	require.Equal(t, "start", st.RecoveryPoint)
	require.NotNil(t, st.LastError)
	require.Contains(t, *st.LastError, "too large")

	sweepable(t, b.db)
	taken, err = e.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 1})
	require.NoError(t, err)
	out, err = e.Maintenance().Run(ctx, taken[0], &workflow.RunOpts{MaxAttempts: 3})
	require.NoError(t, err)
	require.Equal(t, workflow.OutcomeDeadLettered, out.Outcome)
	require.Equal(t, "dead", state(t, b.db, "acct", "big").Status)
	_, err = e.Resume(ctx, "acct", "big")
	require.ErrorIs(t, err, workflow.ErrDeadLettered)
}

func TestRedriveAndExpireValidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	require.ErrorIs(t, b.engine.Redrive(ctx, "acct", ""), workflow.ErrInvalidKey)
	require.ErrorIs(t, b.engine.Redrive(ctx, "acct", "none"), workflow.ErrNotFound)
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.NoError(t, err)
	requireWrongStatus(t, b.engine.Redrive(ctx, "acct", "k"), "not dead-lettered")

	_, err = b.engine.Maintenance().ExpireFinished(ctx, 0, 10)
	require.Error(t, err)
	_, err = b.engine.Maintenance().ExpireFinished(ctx, time.Hour, 0)
	require.Error(t, err)
	n, err := b.engine.Maintenance().ExpireFinished(ctx, time.Hour, 10)
	require.NoError(t, err)
	require.Zero(t, n, "the key finished just now")
	_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET finished_at = statement_timestamp() - interval '61 minutes'`)
	require.NoError(t, err)
	n, err = b.engine.Maintenance().ExpireFinished(ctx, time.Hour, 10)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Zero(t, countKeys(t, b.db))
}
