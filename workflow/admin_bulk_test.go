package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// deadKeys dead-letters the keys of scope, each after one failed payment.
func deadKeys(t *testing.T, b *bundle, scope string, keys ...string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		b.provider.FailNext(1)
		_, err := b.engine.Do(ctx, chargeReq(scope, k, `{"amount":5}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
	}
	sweepable(t, b.db)
	b.provider.FailNext(len(keys))
	for _, o := range sweepOnce(t, b.engine, 1) {
		require.Equal(t, workflow.OutcomeDeadLettered, o)
	}
}

// TestBulkKeysDryRunThenAct: a dry run counts exactly the keys the action then acts
// on, changing nothing; the filter picks by scope, flow, recovery point and error
// text; no filter is refused; the limit bounds and says there is more.
func TestBulkKeysDryRunThenAct(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	deadKeys(t, b, "a", "a1", "a2", "a3", "a4", "a5")
	deadKeys(t, b, "b", "b1", "b2")
	before := map[string]string{}
	for _, k := range []string{"a1", "a2", "a3", "a4", "a5"} {
		before[k] = keyRow(t, b.db, "a", k)
	}
	info, err := b.engine.InspectKey(ctx, "a", "a1")
	require.NoError(t, err)
	require.NotEmpty(t, info.LastError)
	errText := info.LastError[:min(len(info.LastError), 20)]

	_, err = b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRedrive, DryRun: true})
	require.ErrorIs(t, err, workflow.ErrEmptyFilter)
	_, err = b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: "purge", Scope: "a"})
	require.ErrorIs(t, err, workflow.ErrInvalidRequest)

	all, err := b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRedrive, All: true, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, workflow.BulkResult{Matched: 7}, all)
	few, err := b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRedrive, All: true, DryRun: true, Limit: 3})
	require.NoError(t, err)
	require.Equal(t, workflow.BulkResult{Matched: 3, More: true}, few)
	none, err := b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRedrive, Scope: "a", RecoveryPoint: "settle", DryRun: true})
	require.NoError(t, err)
	require.Zero(t, none.Matched, "no key of scope a stands at settle")
	rel, err := b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRelease, Scope: "a", DryRun: true})
	require.NoError(t, err)
	require.Zero(t, rel.Matched, "release selects keys in progress, and these are dead")

	opts := workflow.BulkOptions{Action: workflow.BulkRedrive, Scope: "a", Flow: "charge3", RecoveryPoint: "reserve", ErrorContains: errText, DryRun: true}
	dry, err := b.engine.BulkKeys(ctx, opts)
	require.NoError(t, err)
	require.Equal(t, workflow.BulkResult{Matched: 5}, dry)
	for k, row := range before {
		require.Equal(t, row, keyRow(t, b.db, "a", k), "a dry run changes nothing")
	}

	opts.DryRun = false
	done, err := b.engine.BulkKeys(ctx, opts)
	require.NoError(t, err)
	require.Equal(t, workflow.BulkResult{Matched: dry.Matched, Acted: dry.Matched}, done, "acted on what the dry run counted")
	for k := range before {
		require.Equal(t, "in_progress", state(t, b.db, "a", k).Status, k)
	}
	for _, k := range []string{"b1", "b2"} {
		require.Equal(t, "dead", state(t, b.db, "b", k).Status, "%s: other scope untouched", k)
	}
	again, err := b.engine.BulkKeys(ctx, opts)
	require.NoError(t, err)
	require.Zero(t, again.Matched, "nothing left to re-drive")

	// Release the re-driven keys, then let a sweeper finish them: one payment each.
	released, err := b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRelease, Scope: "a"})
	require.NoError(t, err)
	require.Equal(t, 5, released.Acted)
	for _, o := range sweepOnce(t, b.engine, 5) {
		require.Equal(t, workflow.OutcomeFinished, o)
	}
	for k := range before {
		requireOneEffect(t, b, "a", k)
	}
}

// TestBulkReleaseFencesHolder: a bulk release of a key whose holder is paused in its
// call phase bumps the lock version: the holder, let go, pays (the call was already
// under way) but cannot commit, and a sweep finishes the key with one effect.
func TestBulkReleaseFencesHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	h := testflow.NewHolder("held")
	e := b.newEngine(t, setupOpts{before: h.Before})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, chargeReq("other", "held", `{"amount":4}`))
		done <- err
	}()
	<-h.Entered
	before := state(t, b.db, "other", "held")
	res, err := b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRelease, Scope: "other"})
	require.NoError(t, err)
	require.Equal(t, workflow.BulkResult{Matched: 1, Acted: 1}, res)
	require.Equal(t, before.LockVersion+1, state(t, b.db, "other", "held").LockVersion)
	h.Let()
	require.ErrorIs(t, <-done, workflow.ErrLeaseLost, "the holder's commit is fenced")
	require.Equal(t, testflow.Effects{Ledger: 1}, effects(t, b.db, "other", "held"), "nothing settled by the holder")
	require.Equal(t, []workflow.Outcome{workflow.OutcomeFinished}, sweepOnce(t, b.engine, 5))
	requireOneEffect(t, b, "other", "held")
}

// TestCancelKey: a key past a call phase's start is refused without force, changing
// nothing, and the refusal names the derived key; forced, the answer is stored,
// replayed byte for byte, and the sweeper never takes the key. A 5xx, a header the
// engine does not store and a finished key are refused.
func TestCancelKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	deadKeys(t, b, "acct", "dead")
	row := keyRow(t, b.db, "acct", "dead")
	info, err := b.engine.InspectKey(ctx, "acct", "dead")
	require.NoError(t, err)
	answer := workflow.CancelOptions{Status: 409, Header: map[string][]string{"content-type": {"application/problem+json"}},
		Body: []byte(`{"type":"about:blank","title":"cancelled by the operator"}`)}

	err = b.engine.CancelKey(ctx, "acct", "dead", answer)
	require.ErrorIs(t, err, workflow.ErrCallMayHaveRun)
	var refused *workflow.CallMayHaveRunError
	require.True(t, errors.As(err, &refused))
	require.Equal(t, []string{"pay"}, refused.Phases)
	require.Equal(t, []string{info.ID + ":pay"}, refused.DerivedKeys)
	require.Contains(t, err.Error(), info.ID+":pay")
	require.Equal(t, row, keyRow(t, b.db, "acct", "dead"), "a refusal changes nothing")

	for _, bad := range []workflow.CancelOptions{
		{Status: 503}, {Status: 302}, {Status: 199},
		{Status: 200, Header: map[string][]string{"Set-Cookie": {"a=b"}}, Force: true},
		{Status: 200, Header: map[string][]string{"Content-Type": {"a\r\nb"}}, Force: true},
	} {
		require.ErrorIs(t, b.engine.CancelKey(ctx, "acct", "dead", bad), workflow.ErrInvalidRequest, "%+v", bad)
		require.Equal(t, row, keyRow(t, b.db, "acct", "dead"))
	}

	answer.Force = true
	require.NoError(t, b.engine.CancelKey(ctx, "acct", "dead", answer))
	st := state(t, b.db, "acct", "dead")
	require.Equal(t, "finished", st.Status)
	require.Equal(t, info.LockVersion+1, st.LockVersion, "the lock version is bumped")
	res, err := b.engine.Do(ctx, chargeReq("acct", "dead", `{"amount":5}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 409, res.Response.Status)
	require.Equal(t, answer.Body, res.Response.Body, "byte for byte")
	require.Equal(t, []string{"application/problem+json"}, res.Response.Header["Content-Type"])
	after, err := b.engine.InspectKey(ctx, "acct", "dead")
	require.NoError(t, err)
	require.Equal(t, answer.Body, after.ResponseBody)
	require.Equal(t, 409, after.ResponseStatus)
	last := after.History[len(after.History)-1]
	require.Equal(t, workflow.OutcomeOperatorCancelled, last.Outcome)
	require.Equal(t, workflow.ExecutorOperator, last.By)

	sweepable(t, b.db)
	require.Empty(t, sweepOnce(t, b.engine, 5), "the sweeper never takes a cancelled key")
	requireWrongStatus(t, b.engine.CancelKey(ctx, "acct", "dead", answer), "finished")
	require.ErrorIs(t, b.engine.CancelKey(ctx, "acct", "nope", answer), workflow.ErrNotFound)
	require.Zero(t, b.provider.Made(), "the provider failed every call: nothing to reconcile here")
}

// TestCancelKeyBeforeCall: a key whose next commit is a tx phase before any call
// phase is cancelled without force; an engine that does not know the flow refuses it.
func TestCancelKeyBeforeCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	failB := true
	tx := func(name string) phases.Phase {
		return phases.Tx(name, func(ctx context.Context, _ phases.DBTX, _ *phases.Run) (*phases.Response, error) {
			if name == "b" && failB {
				return nil, fmt.Errorf("b fails once")
			}
			if name == "d" {
				return &phases.Response{Status: 201, Body: []byte(`{}`)}, nil
			}
			return nil, nil
		})
	}
	called := 0
	flow := phases.Flow{Name: "four", Phases: []phases.Phase{tx("a"), tx("b"),
		phases.Call("c", func(context.Context, *phases.Run) (*phases.Response, error) { called++; return nil, nil }), tx("d")}}
	require.NoError(t, b.engine.Register(flow))
	req := workflow.Request{Scope: "s", Key: "k", Flow: "four", Method: "POST", Route: "/four", Body: []byte(`{}`)}
	_, err := b.engine.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.Equal(t, "a", state(t, b.db, "s", "k").RecoveryPoint)

	bare, err := workflow.New(b.db.Pool, nil) // knows no flow, as the CLI's engine
	require.NoError(t, err)
	var refused *workflow.CallMayHaveRunError
	require.True(t, errors.As(bare.CancelKey(ctx, "s", "k", workflow.CancelOptions{Status: 422}), &refused))
	require.True(t, refused.FlowUnknown)

	require.NoError(t, b.engine.CancelKey(ctx, "s", "k", workflow.CancelOptions{Status: 422, Body: []byte("no")}))
	failB = false
	res, err := b.engine.Do(ctx, req)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 422, res.Response.Status)
	require.Equal(t, []byte("no"), res.Response.Body)
	require.Zero(t, called)
}

// TestBulkKeysRecheckEachKey: each key is re-checked by the statement that acts on it.
// While the action runs (in the hook of its first key), one key's error is changed so
// that the filter no longer matches it and another is re-driven by hand: both are
// left alone and counted in Changed, not acted on.
func TestBulkKeysRecheckEachKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var b *bundle
	var meddled bool
	hooks := workflow.Hooks{Key: func(_ context.Context, ev workflow.KeyEvent) {
		if ev.Kind != workflow.OutcomeRedriven || meddled || ev.Scope != "a" {
			return
		}
		meddled = true
		_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET last_error = 'something else' WHERE idempotency_key = 'a2'`)
		require.NoError(t, err)
		require.NoError(t, b.engine.Redrive(ctx, "a", "a3"))
	}}
	b = setup(t, setupOpts{cfg: &workflow.Config{Hooks: hooks}})
	deadKeys(t, b, "a", "a1", "a2", "a3", "a4")
	info, err := b.engine.InspectKey(ctx, "a", "a1")
	require.NoError(t, err)
	res, err := b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRedrive, Scope: "a", ErrorContains: info.LastError})
	require.NoError(t, err)
	require.True(t, meddled)
	require.Equal(t, workflow.BulkResult{Matched: 2, Acted: 2, Changed: 2}, res)
	st := state(t, b.db, "a", "a2")
	require.Equal(t, "dead", st.Status, "its error no longer matches: left dead")
	a3, err := b.engine.InspectKey(ctx, "a", "a3")
	require.NoError(t, err)
	redrives := 0
	for _, h := range a3.History {
		if h.Outcome == workflow.OutcomeRedriven {
			redrives++
		}
	}
	require.Equal(t, 1, redrives, "re-driven once, by hand; not again by the bulk action")
}
