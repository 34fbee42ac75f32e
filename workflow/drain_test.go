package workflow_test

import (
	"context"
	"net/http"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// startDrain starts e.Drain(ctx) and returns once the drain began.
func startDrain(ctx context.Context, e *workflow.Engine) <-chan error {
	done := make(chan error, 1)
	go func() { done <- e.Drain(ctx) }()
	for !workflow.Draining(e) {
		runtime.Gosched()
	}
	return done
}

// A draining engine takes no new key: the attempt is turned away, nothing written.
func TestDrainRefusesNewKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	require.NoError(t, b.engine.Drain(context.Background()))
	_, err := b.engine.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`))
	shedWith(t, err, workflow.ErrDraining)
	_, err = b.engine.Resume(context.Background(), "acct", "k1")
	shedWith(t, err, workflow.ErrDraining)
	require.Equal(t, 0, countKeys(t, b.db))
}

// An attempt in a tx phase when the drain begins finishes the phase, then starts no
// call phase: it releases its key, which another engine resumes at once.
func TestDrainStartsNoCall(t *testing.T) {
	t.Parallel()
	g := newGate(testflow.Reserve)
	b := setup(t, setupOpts{before: g.before})
	g.openAtEnd(t)
	done := make(chan error, 1)
	go func() {
		_, err := b.engine.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`))
		done <- err
	}()
	require.Equal(t, "k1", <-g.entered)
	drained := startDrain(context.Background(), b.engine)
	g.open()
	err := <-done
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.ErrorIs(t, err, workflow.ErrDraining)
	require.NoError(t, <-drained)
	require.Equal(t, 0, b.provider.Made(), "a call phase started after the drain began")
	st := state(t, b.db, "acct", "k1")
	require.Equal(t, testflow.Reserve, st.RecoveryPoint)
	require.False(t, st.HasLease, "the key is still leased")

	other := b.newEngine(t, setupOpts{})
	res, err := other.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)
	requireOneEffect(t, b, "acct", "k1")
}

// At the drain's deadline, attempts still running (one in a call, one in a tx phase,
// neither honouring its context) are given up: their keys are released with the lock
// version bumped, so another engine's retry resumes them at once, and the abandoned
// attempts can commit nothing when they wake.
func TestDrainDeadlineReleasesKeys(t *testing.T) {
	t.Parallel()
	call, tx := newGate(testflow.Pay), newGate(testflow.Settle)
	b := setup(t, setupOpts{before: func(ctx context.Context, db phases.DBTX, run *phases.Run) error {
		if run.Key() == "call" {
			return call.before(ctx, db, run)
		}
		return tx.before(ctx, db, run)
	}})
	call.openAtEnd(t)
	tx.openAtEnd(t)
	done := make(chan error, 2)
	for _, key := range []string{"call", "tx"} {
		go func() {
			_, err := b.engine.Do(context.Background(), chargeReq("acct", key, `{"amount":5}`))
			done <- err
		}()
	}
	require.Equal(t, "call", <-call.entered)
	require.Equal(t, "tx", <-tx.entered)
	ctx, cancel := context.WithCancel(context.Background())
	drained := startDrain(ctx, b.engine)
	cancel() // the deadline passes with both attempts running
	require.ErrorIs(t, <-drained, context.Canceled)
	for _, key := range []string{"call", "tx"} {
		st := state(t, b.db, "acct", key)
		require.False(t, st.HasLease, "key %s is still leased", key)
		require.EqualValues(t, 2, st.LockVersion, "key %s: the drain did not fence its attempt", key)
	}

	other := b.newEngine(t, setupOpts{})
	for _, key := range []string{"call", "tx"} {
		res, err := other.Do(context.Background(), chargeReq("acct", key, `{"amount":5}`))
		require.NoError(t, err, "key %s: the retry after the drain was not answered", key)
		require.Equal(t, http.StatusCreated, res.Response.Status)
	}
	call.open()
	tx.open()
	for range 2 {
		require.ErrorIs(t, <-done, workflow.ErrLeaseLost)
	}
	requireOneEffect(t, b, "acct", "call")
	requireOneEffect(t, b, "acct", "tx")
	require.Equal(t, 2, b.provider.Made())
}
